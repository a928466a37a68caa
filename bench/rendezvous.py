"""Rendezvous benchmark: the cost of keeping the job's state in etcd, and what training sees
when the rendezvous dies.

1. New generation after a membership change, with 8, 64 and 512 simulated agents (each a host
   with one worker; gRPC clients on loopback, all in this process), for `--store memory` and
   `--store etcd://...`: a member's session closes (it died) and we time until every survivor
   holds its assignment in the next generation. The rendezvous is a real `ringmaster serve`.
2. Rendezvous-down window: a real job (2 emulated hosts, etcd store) whose `serve` is SIGKILLed
   and started again; training's commits before, during and after, and the steps lost.
3. etcd member lost: a three-member etcd cluster; the member the store talks to is SIGKILLed
   (a follower, then the raft leader) and the next write is timed: it goes to another member.

Run: python bench/rendezvous.py [--agents 8,64,512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from etcd_server import ETCD, EtcdCluster, EtcdServer  # noqa: E402
from harness import free_port, wait_for  # noqa: E402
from simulated_hosts import one_change  # noqa: E402


def serve(port: int, hosts: int, store: str, extra: list[str]) -> subprocess.Popen:
    hosts_flag = ",".join(f"h{i}:1" for i in range(hosts))
    return subprocess.Popen(
        [sys.executable, "-m", "ringmaster.cli", "serve", "-H", hosts_flag, "--min-np", "1", "--port", str(port),
         "--api-port", "0", "--store", store, "--heartbeat-interval", "5", "--heartbeat-timeout", "120",
         "--start-timeout", "120", *extra, "python", "-c", "pass"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


async def generation_times(agents: list[int], repeats: int, etcd: EtcdServer | None) -> None:
    """One event loop for all runs: grpc.aio binds itself to the first loop it sees."""
    print("## New generation after a member dies (survivors all assigned): median (each run; the server's CPU time, "
          "median)")
    print("| agents | memory store | etcd store |")
    print("| --- | --- | --- |")
    for count in agents:
        row = []
        for kind in ("memory", "etcd"):
            if kind == "etcd" and etcd is None:
                row.append("(no etcd)")
                continue
            times, cpus = [], []
            for run in range(repeats):
                port = free_port()
                store = "memory" if kind == "memory" else f"etcd://127.0.0.1:{etcd.client_port}/bench/{count}/{run}/{time.time_ns()}"
                proc = serve(port, count, store, [])
                try:
                    elapsed, cpu = await one_change(f"127.0.0.1:{port}", count, proc.pid)
                    times.append(elapsed)
                    cpus.append(cpu)
                finally:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            row.append(f"{statistics.median(times) * 1e3:.1f} ms ({', '.join(f'{t * 1e3:.1f}' for t in times)}; "
                       f"server CPU {statistics.median(cpus) * 1e3:.0f} ms)")
        print(f"| {count} | {row[0]} | {row[1]} |", flush=True)


def down_window(etcd: EtcdServer, down_s: float) -> None:
    print(f"\n## Rendezvous SIGKILLed and started again {down_s:g} s later (2 hosts, etcd store, step 50 ms)")
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = pathlib.Path(tmp)
        port = free_port()
        args = [sys.executable, "-m", "ringmaster.cli", "serve", "-H", "hA:1,hB:1", "--port", str(port),
                "--store", f"etcd://127.0.0.1:{etcd.client_port}/bench/down/{time.time_ns()}",
                sys.executable, str(ROOT / "tests" / "workloads" / "elastic_job.py"), "--log-dir", tmp,
                "--epochs", "3", "--samples", "128", "--step-time", "0.05", "--timestamps"]
        procs = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)]
        try:
            for host in ("hA", "hB"):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "ringmaster.worker.agent", "--rendezvous",
                     f"127.0.0.1:{port}", "--host", host],
                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))

            def commits() -> list[dict]:
                records = []
                for path in log_dir.glob("*.jsonl"):
                    records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                return [r for r in records if r["event"] == "commit" and r["rank"] == 0]

            wait_for(lambda: len(commits()) >= 20, 120, "training")
            killed = time.time()
            os.killpg(procs[0].pid, signal.SIGKILL)
            procs[0].wait()
            time.sleep(down_s)  # the outage itself: what is measured is training during it
            restarted = time.time()
            procs[0] = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
            code = procs[0].wait(timeout=300)
            records = sorted(commits(), key=lambda r: r["time"])
            steps = [r["step"] for r in records]
            during = [r for r in records if killed <= r["time"] <= restarted]
            gaps = [b["time"] - a["time"] for a, b in zip(records, records[1:])]
            lost = sum(1 for a, b in zip(steps, steps[1:]) if b <= a)
            print(f"- job exit code: {code}; generations: {sorted({r['generation'] for r in records})}")
            print(f"- steps committed while the rendezvous was down ({restarted - killed:.1f} s): {len(during)}")
            print(f"- longest pause between two commits: {max(gaps) * 1e3:.0f} ms "
                  f"(median step {statistics.median(gaps) * 1e3:.0f} ms)")
            print(f"- steps lost (committed again after a rollback): {lost}")
        finally:
            for proc in procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()


async def write_after_member_loss(root: pathlib.Path, kill_raft_leader: bool) -> tuple[float, float]:
    """Seconds of the first write after the member in use dies, and of a write before it."""
    from ringmaster.rendezvous.state.etcd_kv import EtcdStore

    cluster = EtcdCluster(root).start()
    try:
        victim = (
            cluster.raft_leader() if kill_raft_leader else next(m for m in cluster.members if not m.is_raft_leader())
        )
        others = [m.endpoint for m in cluster.members if m is not victim]
        store = await EtcdStore.connect([victim.endpoint, *others])
        try:
            started = time.perf_counter()
            await store.put("/bench/member-loss/a", {"n": 1})
            before = time.perf_counter() - started
            victim.kill()
            started = time.perf_counter()
            await store.put("/bench/member-loss/b", {"n": 2})
            return time.perf_counter() - started, before
        finally:
            await store.close()
    finally:
        cluster.kill()


def member_loss(repeats: int) -> None:
    print("\n## etcd member in use SIGKILLed (3-member cluster): the next write, sent on to another member")
    for kill_raft_leader, what in ((False, "a follower"), (True, "the raft leader")):
        after, before = [], []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                took, usual = asyncio.run(write_after_member_loss(pathlib.Path(tmp), kill_raft_leader))
            after.append(took)
            before.append(usual)
        print(f"- {what}: {', '.join(f'{t * 1e3:.0f}' for t in after)} ms "
              f"(a write before the kill: {statistics.median(before) * 1e3:.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="8,64,512")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--down", type=float, default=3.0, help="seconds the rendezvous stays dead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdServer(pathlib.Path(tmp)).start() if ETCD else None
        try:
            asyncio.run(generation_times([int(a) for a in args.agents.split(",")], args.repeats, etcd))
            if etcd is not None:
                down_window(etcd, args.down)
                member_loss(args.repeats)
        finally:
            if etcd is not None:
                etcd.kill()


if __name__ == "__main__":
    main()
