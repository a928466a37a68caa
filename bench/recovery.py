"""How fast Ringmaster recovers and rebuilds rings, next to the baseline, in one run.

Part 1 (a real `ringmaster run`, 4 workers on 2 emulated hosts, a commit every step):
  - seconds from SIGKILL of a host to the first completed step after it, and steps redone;
  - seconds from a discovery change to the first step at the new size: a new host (its agent
    starts then), and two slots more on a host whose agent runs (its warm spares used), each
    next to the survivors' longest pause; without warm spares and with (`--spares 0,2`).
Part 2 (raw torch.distributed, N processes on this machine):
  - ring rebuild as Ringmaster does it (a new Gloo group on a fresh key prefix of a long-lived
    store) next to a fresh `init_process_group` (new TCP rendezvous, as a restart does),
    for 2, 4 and 8 ranks: median of the slowest rank over several rounds, to the first allreduce.

Run: python bench/recovery.py [--rounds 10] [--skip-job]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import pathlib
import signal
import socket
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------- part 1
def job_figures(spares: int) -> dict[str, float]:
    from harness import WORKLOADS, Job, discovery_script, events, read_logs, write_hosts

    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        script, hosts = discovery_script(d, {"hostA": 2, "hostB": 2})
        (d / "log").mkdir()
        job = Job(["--min-np", "2", "--max-np", "8", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.2",
                   "--spares", str(spares),
                   "python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(d / "log"), "--epochs", "1000",
                   "--samples", "256", "--step-time", "0.02", "--timestamps"])
        try:
            job.wait_status(lambda s: s["world_size"] == 4 and s["steps"] >= 20, 180, "4 workers training")
            # A running job's steady state: its hosts warm (on one machine their imports would
            # otherwise share the CPU with the newcomers measured below; on real hosts they never do).
            wait_warm(job, ["hostA", "hostB"], spares)
            victim = next(h["agent_pid"] for h in job.status()["hosts"] if h["name"] == "hostB")
            killed_at = time.time()
            os.killpg(victim, signal.SIGKILL)
            job.wait_status(lambda s: s["world_size"] == 2 and s["steps"] >= 1, 120, "recovery")
            first_after = wait_record(d, lambda r: r["event"] == "commit" and r["size"] == 2 and r["time"] > killed_at)
            logs = read_logs(d / "log")
            survivors = [w for w in logs if w.startswith("hostA")]
            began = max(
                r["step"] for w in survivors for r in logs[w] if r["event"] == "begin" and r["time"] < killed_at
            )
            resumed = min(r["step"] for r in events(logs, "synced") if r["size"] == 2)
            figures["kill_to_first_step_s"] = first_after["time"] - killed_at
            # the step in flight at the kill is redone unless it was committed before the ring broke
            figures["steps_redone"] = max(0, began - resumed)
            changed_at = time.time()
            write_hosts(hosts, {"hostA": 2, "hostB": 2, "hostC": 2})
            grown = wait_record(d, lambda r: r["event"] == "commit" and r["size"] == 4 and r["time"] > changed_at, 180)
            figures["discovery_change_to_first_step_s"] = grown["time"] - changed_at
            logs = read_logs(d / "log")
            figures["survivor_pause_during_grow_s"] = longest_pause(logs, survivors, changed_at, grown["time"])
            figures["steps_while_newcomers_warmed_up"] = sum(
                1
                for r in logs[survivors[0]]
                if r["event"] == "commit" and changed_at < r["time"] < grown["time"] and r["size"] == 2
            )
            # Slots added on a host whose agent runs (its spares warm): hostA 2 -> 4.
            wait_warm(job, ["hostA"], spares)
            changed_at = time.time()
            write_hosts(hosts, {"hostA": 4, "hostB": 2, "hostC": 2})
            grown = wait_record(d, lambda r: r["event"] == "commit" and r["size"] == 6 and r["time"] > changed_at, 180)
            figures["slots_added_to_first_step_s"] = grown["time"] - changed_at
            figures["survivor_pause_during_slots_added_s"] = longest_pause(read_logs(d / "log"), survivors, changed_at,
                                                                           grown["time"])
            figures["spares_used"] = len(job.events("spare.used"))
        finally:
            job.kill()
    return figures


def wait_warm(job, hosts: list[str], spares: int) -> None:
    """Each host warm: its worker template ready (the agent forks its workers from it and keeps
    no spares then), or, on a host without one, its spares warm."""
    from harness import wait_for

    def warm() -> bool:
        return all(job.events("template.ready", host=h) or len(job.events("spare.ready", host=h)) >= spares
                   for h in hosts)

    wait_for(warm, 120, f"{', '.join(hosts)} warm (worker template or spares)")


def longest_pause(logs: dict[str, list[dict]], survivors: list[str], since: float, until: float) -> float:
    """What the survivors paid while newcomers joined: their longest gap between two commits
    from `since` to a second after `until` (the first step at the new size)."""
    gaps = []
    for worker in survivors:
        times = [r["time"] for r in logs[worker] if r["event"] == "commit" and r["time"] > since]
        gaps += [b - a for a, b in zip(times, times[1:]) if b <= until + 1]
    return max(gaps)


def wait_record(directory: pathlib.Path, predicate, timeout_s: float = 120) -> dict:
    from harness import read_logs, wait_for

    def find():
        matches = [r for records in read_logs(directory / "log").values() for r in records if predicate(r)]
        return min(matches, key=lambda r: r["time"]) if matches else None

    return wait_for(find, timeout_s, "a matching log record", interval_s=0.1)


# ----------------------------------------------------------------------------- part 2
def _rank_main(rank: int, size: int, store_port: int, rounds: int, results) -> None:
    import torch
    import torch.distributed as dist

    from ringmaster.worker.train.collectives import build_process_group

    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=datetime.timedelta(seconds=60))
    timeout = datetime.timedelta(seconds=60)

    def barrier(name: str) -> None:
        store.add(name, 1)
        store.wait([f"{name}/go"]) if rank else _release(store, name, size)

    ours, fresh = [], []
    for r in range(rounds):
        barrier(f"ours{r}")
        t0 = time.perf_counter()
        pg = build_process_group(store, f"gen{r}/", rank, size, 60, "gloo", lambda: None, None)
        pg.allreduce([torch.ones(1)]).wait()
        ours.append(time.perf_counter() - t0)
        del pg  # as Ringmaster drops an idle old ring before building the next

        barrier(f"fresh{r}")
        port = int(store.get(f"port{r}").decode())
        t0 = time.perf_counter()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                                timeout=timeout)
        dist.all_reduce(torch.ones(1))
        fresh.append(time.perf_counter() - t0)
        dist.destroy_process_group()
    results.put((rank, ours, fresh))


def _release(store, name: str, size: int) -> None:
    while int(store.add(name, 0)) < size:
        time.sleep(0.0005)
    store.set(f"{name}/go", "1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rebuild_figures(size: int, rounds: int) -> tuple[float, float]:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for r in range(rounds):
        store.set(f"port{r}", str(_free_port()))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(rank, size, store.port, rounds, results)) for rank in range(size)]
    for p in procs:
        p.start()
    try:
        collected = [results.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
    ours = [max(c[1][r] for c in collected) for r in range(rounds)]
    fresh = [max(c[2][r] for c in collected) for r in range(rounds)]
    # the first round of each pays one-off costs (imports, first connections): skip it
    return statistics.median(ours[1:] or ours), statistics.median(fresh[1:] or fresh)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--skip-job", action="store_true", help="only the ring rebuild figures")
    parser.add_argument("--spares", type=lambda text: [int(n) for n in text.split(",")], default=[0, 2],
                        help="the job's --spares, one run each (default: 0,2)")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores")
    if not args.skip_job:
        runs = {spares: job_figures(spares) for spares in args.spares}
        print("elastic job, 4 workers on 2 emulated hosts, commit every step, discovery polled every 0.2 s:")
        print(f"  {'--spares':<58}" + "".join(f"{spares:>10}" for spares in runs))
        rows = [
            ("SIGKILL of a host -> first completed step after it (s)", "kill_to_first_step_s", ".3f"),
            ("steps redone after the kill", "steps_redone", ".0f"),
            ("a new host (hostC:2) -> first step at 4 (s)", "discovery_change_to_first_step_s", ".3f"),
            ("  steps the survivors trained meanwhile", "steps_while_newcomers_warmed_up", ".0f"),
            ("  survivors' longest pause between two steps (s)", "survivor_pause_during_grow_s", ".3f"),
            ("2 slots more on a running host (hostA 2->4) -> first step at 6 (s)",
             "slots_added_to_first_step_s", ".3f"),
            ("  survivors' longest pause between two steps (s)", "survivor_pause_during_slots_added_s", ".3f"),
            ("  newcomers that ran in a warm spare", "spares_used", ".0f"),
        ]
        for label, key, spec in rows:
            print(f"  {label:<58}" + "".join(f"{format(f[key], spec):>10}" for f in runs.values()))
    print(f"ring rebuild to first allreduce (median of {args.rounds - 1} rounds, slowest rank):")
    print(
        f"  {'ranks':>5}  {'ringmaster (prefix on long-lived store)':>40}  {'fresh init_process_group':>25}  speed-up"
    )
    for size in (2, 4, 8):
        ours, fresh = rebuild_figures(size, args.rounds)
        print(f"  {size:>5}  {ours * 1000:>37.2f} ms  {fresh * 1000:>22.2f} ms  {fresh / ours:>7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
