"""What sharing one pool between jobs costs: a high-priority job taking slots from running ones,
and the pool's use of its slots while ten jobs arrive over time.

A real `ringmaster pool serve` on emulated hosts of this machine (4 hosts x 2 slots), small real
jobs (tests/workloads/elastic_job.py: a commit every step, Gloo rings):
  - preempt: two low-priority jobs run on 4 slots each (--policy priority); a job of priority 10
    asking for 4 slots is submitted. Printed: submit -> its first step, split into submit -> the
    low jobs' first step at their smaller size (they give slots back at a commit) and that ->
    the new job's first step (its workers start, import torch, form their ring); the low jobs'
    commit interval and pause (last step at 4 -> first at 2); steps they trained twice (goal: 0).
  - utilisation: ten jobs of different sizes arrive 2.5 s apart (--policy fifo). The pool is read
    every 0.2 s; printed: slots placed / slots in the pool over the run, and the share of time
    a slot was free while a job that could use it waited or could grow (goal: none, beyond the
    moments a resize takes to be carried out at a commit).

  - adaptive: six jobs, three bound by their ring and three by their compute, under fifo and then
    under goodput (each job's scaling learned from its step times); mean JCT and makespan of each.

Run: python bench/pool.py [--part preempt|utilisation|adaptive|all]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys
import tempfile
import time
import urllib.request
from typing import Any, Callable, Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

HOSTS = "h0:2,h1:2,h2:2,h3:2"
SLOTS = 8


@contextlib.contextmanager
def _pool(*flags: str) -> Iterator[tuple[Any, pathlib.Path]]:
    """A real `pool serve` on HOSTS in a fresh folder; it and every job it started killed at the end."""
    from harness import Job
    from pool_rig import Pool

    jobs: list[Job] = []

    def run_job(*args: str, verb: str = "run", **kw: Any) -> Job:
        job = Job([str(a) for a in args], verb=verb, **kw)
        jobs.append(job)
        return job

    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        try:
            yield Pool(run_job, d, "-H", HOSTS, "--min-resize-interval", "0", *flags), d
        finally:
            for job in reversed(jobs):
                job.kill()


def _commits(log_dir: pathlib.Path) -> list[dict]:
    from harness import read_logs

    return sorted((r for records in read_logs(log_dir).values() for r in records if r["event"] == "commit"),
                  key=lambda r: r["time"])


def _redone(log_dir: pathlib.Path) -> int:
    from harness import read_logs

    return sum(len(steps) - len(set(steps)) for steps in ([r["step"] for r in records if r["event"] == "begin"]
                                                          for records in read_logs(log_dir).values()))


def preempt() -> dict[str, float]:
    from harness import read_logs, wait_for

    with _pool("--policy", "priority") as (pool, d):
        low = [pool.submit(d / f"low{i}", 2, 4, epochs=1000, samples=256, name=f"low{i}") for i in (1, 2)]
        for i, job_id in enumerate(low, 1):
            pool.wait_job(job_id, lambda j: j["state"] == "running" and j["size"] == 4, 120, f"low{i} on 4")
        for i in (1, 2):
            wait_for(lambda: sum(1 for c in _commits(d / f"low{i}") if c["size"] == 4 and c["rank"] == 0) >= 20, 180,
                     f"low{i} training on 4")
        submitted = time.time()
        high = pool.submit(d / "high", 4, 4, epochs=2, samples=64, priority=10, name="high")
        first_high = wait_for(lambda: next((c["time"] for c in _commits(d / "high")), None), 180, "high's first step")
        placed = float(pool.proc.wait_event("pool.job_started", 10, job=high)["time"])
        formed = float(pool.proc.wait_event("generation.formed", 10, job=high)["time"])
        synced = min(r["time"] for records in read_logs(d / "high").values() for r in records if r["event"] == "synced")
        shrunk = [wait_for(lambda: next((c["time"] for c in _commits(d / f"low{i}") if c["size"] == 2), None), 60,
                           f"low{i} at 2") for i in (1, 2)]
        pool.wait_job(high, lambda j: j["state"] == "succeeded", 180, "high to finish")
        for job_id in low:
            pool.call(f"/jobs/{job_id}/cancel", {})
        rank0 = [c["time"] for c in _commits(d / "low1") if c["rank"] == 0 and c["size"] == 4 and c["time"] < submitted]
        last_at_4 = max(c["time"] for c in _commits(d / "low1") if c["size"] == 4 and c["time"] < shrunk[0])
        return {"submit_to_first_step_s": first_high - submitted,
                "submit_to_low_jobs_shrunk_s": max(shrunk) - submitted,
                "low_shrunk_to_high_first_step_s": first_high - max(shrunk),
                "submit_to_high_placed_s": placed - submitted,
                "placed_to_ring_formed_s": formed - placed,
                "formed_to_first_step_s": first_high - formed,
                "of_which_state_synced_at_s": synced - formed,
                "low_commit_interval_s": statistics.median(b - a for a, b in zip(rank0, rank0[1:])),
                "low_pause_s": shrunk[0] - last_at_4,
                "steps_trained_twice": float(sum(_redone(d / f"low{i}") for i in (1, 2)))}


#: (min_np, max_np, epochs, samples) of the ten jobs, in order of arrival.
ARRIVALS = [(2, 4, 6, 192), (1, 2, 4, 96), (4, 8, 6, 384), (2, 2, 3, 64), (1, 4, 5, 160), (2, 6, 6, 256),
            (1, 1, 3, 48), (4, 4, 3, 128), (2, 8, 5, 320), (1, 3, 4, 96)]


def _read(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)


def utilisation() -> dict[str, float]:
    with _pool("--policy", "fifo") as (pool, d):
        samples: list[tuple[float, int, bool]] = []  # (time, slots placed, a free slot a job could use)
        submitted: dict[str, float] = {}
        next_at = time.time()
        started = time.time()
        while True:
            now = time.time()
            if len(submitted) < len(ARRIVALS) and now >= next_at:
                min_np, max_np, epochs, count = ARRIVALS[len(submitted)]
                job_id = pool.submit(d / f"j{len(submitted)}", min_np, max_np, epochs=epochs, samples=count)
                submitted[job_id] = now
                next_at += 2.5
            rows = _read(f"{pool.url}/jobs")
            placed = sum(r["size"] for r in rows if r["state"] in ("running", "suspending", "cancelling"))
            free = SLOTS - placed
            could_use = free > 0 and any(
                (r["state"] == "queued" and r["min_np"] <= free)
                or (r["state"] == "running" and r["size"] < r["max_np"])
                for r in rows
            )
            samples.append((now, placed, could_use))
            if len(submitted) == len(ARRIVALS) and all(r["state"] in ("succeeded",
                                                                      "failed", "cancelled") for r in rows):
                break
            if now - started > 600:
                raise RuntimeError("the ten jobs did not finish within 10 minutes")
            time.sleep(0.2)
        rows = _read(f"{pool.url}/jobs")
        failed = [r["id"] for r in rows if r["state"] != "succeeded"]
        if failed:
            raise RuntimeError(f"jobs that did not succeed: {failed}")
        span = [(b[0] - a[0], a) for a, b in zip(samples, samples[1:])]
        total = sum(dt for dt, _ in span)
        waits = [r["started_at"] - r["submitted"] for r in rows]
        return {"makespan_s": samples[-1][0] - samples[0][0],
                "slots_placed_share": sum(dt * s[1] for dt, s in span) / (total * SLOTS),
                "time_with_a_usable_slot_free_share": sum(dt for dt, s in span if s[2]) / total,
                "mean_wait_s": statistics.mean(waits), "max_wait_s": max(waits)}


#: The six jobs of the goodput comparison, in order of arrival: (name, paced_job arguments).
MIX = [(f"{kind}{i}", args) for i in range(3) for kind, args in
       (("ring", ["--params", "4000000", "--commit-every", "10", "--samples", "4000"]),
        ("compute", ["--wait", "0.1", "--samples", "900"]))]


def adaptive() -> dict[str, float]:
    """The same six jobs (1 to 4 workers each, one second apart) under fifo, then under goodput:
    three bound by their ring (a large model, little compute: fastest alone), three by their
    compute (a step cost that runs in parallel: they scale). Mean JCT and makespan of each run."""
    from harness import WORKLOADS

    figures: dict[str, float] = {}
    for policy in ("fifo", "goodput"):
        with _pool("--policy", policy, "--min-resize-interval", "5", "--resize-cost", "0.1") as (pool, d):
            ids = []
            for name, args in MIX:
                command = ["python", str(WORKLOADS / "paced_job.py"), *args, "--commit-log", str(d / f"{name}.jsonl")]
                ids.append(str(pool.call("/jobs", {"command": command, "min_np": 1, "max_np": 4, "name": name})["id"]))
                time.sleep(1.0)
            rows = [pool.wait_job(job_id, lambda j: j["state"] == "succeeded", 600,
                                  f"{job_id} to finish") for job_id in ids]
            jcts = [r["ended_at"] - r["submitted"] for r in rows]
            figures[f"{policy}_mean_jct_s"] = statistics.mean(jcts)
            figures[f"{policy}_makespan_s"] = max(r["ended_at"] for r in rows) - min(r["submitted"] for r in rows)
            for kind in ("ring", "compute"):
                figures[f"{policy}_{kind}_mean_jct_s"] = statistics.mean(
                    jct for (name, _), jct in zip(MIX, jcts) if name.startswith(kind))
    figures["goodput_over_fifo_mean_jct"] = figures["goodput_mean_jct_s"] / figures["fifo_mean_jct_s"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["preempt", "utilisation", "adaptive", "all"], default="all")
    args = parser.parse_args()
    parts: dict[str, Callable[[], dict[str, float]]] = {"preempt": preempt, "utilisation": utilisation,
                                                        "adaptive": adaptive}
    for name, part in parts.items():
        if args.part in (name, "all"):
            figures = part()
            print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
