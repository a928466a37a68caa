"""The figures README promises, measured in one run and set beside the values recorded in
`bench/headline.json`, each with the tolerance this noisy 2-core machine needs.

- a worker SIGKILLed -> the first committed step after it (4 workers on 2 emulated hosts, a
  commit every step; the killed worker's host has another worker, which leaves with it);
- a host added by discovery -> the first step at the new size, and the survivors' longest pause
  meanwhile (`bench/recovery.py`'s job, warm spares on);
- a drain announced by a preemption notice -> steps redone (`bench/drain.py`'s job);
- the 25 M-parameter MLP's training step with `hvd.DistributedOptimizer` against DDP in the same
  two processes (`bench/datapath.py`), as a ratio.

A figure worse than its recorded value by more than its tolerance is a regression: the line says
REGRESSED and the run exits 1. Run it before resolving anything that touches the control or data
path; `--record` writes this run's figures as the new recorded values (after an improvement).

Run: python bench/headline.py [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
RECORDED = ROOT / "bench" / "headline.json"


def worker_kill_figure() -> float:
    """Seconds from the SIGKILL of one worker process to the first step committed after it."""
    import psutil
    from harness import WORKLOADS, Job, read_logs, wait_for

    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        (d / "log").mkdir()
        job = Job(["-H", "hostA:2,hostB:2", "--min-np", "2", "--max-np", "4", "--spares", "0",
                   "python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(d / "log"), "--epochs", "1000",
                   "--samples", "256", "--step-time", "0.02", "--timestamps"])
        try:
            job.wait_status(lambda s: s["world_size"] == 4 and s["steps"] >= 40, 180, "4 workers training")
            # The victim by the job's own account of its workers (forked from the agent's worker
            # template, a worker's command line is the template's, not the script's).
            status = job.status()
            victim = next(w["pid"] for w in status["workers"] if w["host"] == "hostB" and w["rank"] is not None
                          and w["pid"] and psutil.pid_exists(w["pid"]))
            generation = status["generation"]
            killed_at = time.time()
            os.kill(victim, signal.SIGKILL)

            def first_after() -> float | None:
                # a commit of a ring formed after the kill (one of the old ring may land a moment
                # after the kill, its step's collectives done before the worker died)
                times = [r["time"] for rs in read_logs(d / "log").values() for r in rs
                         if r["event"] == "commit" and r["time"] > killed_at and r["generation"] > generation]
                return min(times) if times else None

            return wait_for(first_after, 120, "a step after the kill", interval_s=0.1) - killed_at
        finally:
            job.kill()


def measure() -> dict[str, float]:
    import datapath
    import drain
    import recovery

    figures: dict[str, float] = {}
    figures["worker_kill_to_first_step_s"] = worker_kill_figure()
    print(f"  worker killed -> first step: {figures['worker_kill_to_first_step_s']:.3f} s", flush=True)
    grown = recovery.job_figures(spares=1)
    figures["host_added_to_first_step_s"] = grown["discovery_change_to_first_step_s"]
    figures["survivor_pause_during_growth_s"] = grown["survivor_pause_during_grow_s"]
    figures["host_killed_to_first_step_s"] = grown["kill_to_first_step_s"]
    print(f"  host added -> first step at the new size: {figures['host_added_to_first_step_s']:.2f} s "
          f"(survivors' longest pause {figures['survivor_pause_during_growth_s']:.3f} s)", flush=True)
    figures["drain_steps_redone"] = drain.one_round("notice")["steps_redone"]
    result = datapath.ringmaster("train", "mlp-25m", 40)
    figures["mlp_25m_step_vs_ddp"] = statistics.median(result["times"]["Ringmaster"]) / statistics.median(
        result["times"]["DDP"])
    return figures


def verdicts(figures: dict[str, float], recorded: dict[str, dict]) -> list[tuple[str, float, dict, bool]]:
    """(name, measured, its record, regressed) for each recorded figure: worse than the recorded
    value by more than both its relative and its absolute tolerance (lower is better for all)."""
    out = []
    for name, record in recorded.items():
        value = figures[name]
        allowed = max(record["value"] * (1 + record.get("relative", 0.0)),
                      record["value"] + record.get("absolute", 0.0))
        out.append((name, value, record, value > allowed))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="write this run's figures into bench/headline.json")
    args = parser.parse_args()
    recorded: dict[str, dict] = json.loads(RECORDED.read_text())["figures"]
    started = time.monotonic()
    print("measuring (a few minutes) ...", flush=True)
    figures = measure()
    failed = report(figures, recorded)
    print(f"({time.monotonic() - started:.0f} s; the recorded values: {RECORDED.relative_to(ROOT)})")
    if args.record:
        record(RECORDED, figures)
    return 1 if failed else 0


def report(figures: dict[str, float], recorded: dict[str, dict]) -> bool:
    """Print each recorded figure beside this run's with its verdict; whether any regressed."""
    width = max(len(name) for name in recorded) + 2
    print(f"\n{'figure':<{width}} {'this run':>10} {'recorded':>10}  tolerance        verdict")
    failed = False
    for name, value, kept, regressed in verdicts(figures, recorded):
        tolerance = f"+{kept.get('relative', 0) * 100:.0f}% or +{kept.get('absolute', 0):g}"
        print(f"{name:<{width}} {value:>10.3f} {kept['value']:>10.3f}  {tolerance:<16} "
              f"{'REGRESSED' if regressed else 'ok'}")
        failed |= regressed
    return failed


def record(path: pathlib.Path, figures: dict[str, float]) -> None:
    """Write this run's figures into the recorded values at `path` (after an improvement)."""
    data = json.loads(path.read_text())
    for name in data["figures"]:
        data["figures"][name]["value"] = round(figures[name], 3)
    path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
