"""What adding a host costs: a host that joins by connecting (warm or cold) against one that
discovery finds.

The same job each time (elastic_job.py, one worker on hostA, a commit every step), and once it
has trained 20 steps a second host with one slot is added one of three ways:
  - discovery: `run` with a discovery script; hostB is written into the host file it prints
    (polled every 0.3 s), and the launcher starts hostB's agent, which starts its worker;
  - connect-warm: `serve --hosts-from-agents`; `ringmaster agent --host hostB --slots 1` is started
    by hand (as Kubernetes or `srun` would), warms a spare per slot, then says hello;
  - connect-cold: the same agent with `--no-warm-join` (it says hello at once; its worker starts
    an interpreter and imports torch after it is given work).
For each it prints the seconds from the moment the host appeared (written into the host file;
the agent's hello) to the first step at size 2, and from the agent's start (the process
launched) to that step, which is what the engine that starts the agent waits.

Run: python bench/join.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

STEPS_BEFORE = 20


def _first_step_at_two(log_dir: pathlib.Path) -> float | None:
    from harness import read_logs

    times = [r["time"] for records in read_logs(log_dir).values() for r in records
             if r["event"] == "commit" and r["size"] == 2]
    return min(times) if times else None


def one_round(way: str) -> dict[str, float]:
    """Seconds from the host's appearance, and from its agent's start, to the first step at size 2."""
    from harness import WORKLOADS, Job, discovery_script, wait_for, write_hosts

    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        (d / "log").mkdir()
        workload = ["python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(d / "log"), "--epochs", "1000",
                    "--samples", "256", "--step-time", "0.02", "--timestamps"]
        common = ["--min-np", "1", "--max-np", "2", "--discovery-interval", "0.3", "--warmup-grace", "10"]
        jobs: list[Job] = []
        try:
            if way == "discovery":
                script, hosts_file = discovery_script(d, {"hostA": 1})
                job = Job(["--host-discovery-script", str(script), *common, *workload])
                jobs.append(job)
                job.wait_status(lambda s: s["world_size"] == 1 and s["steps"] >= STEPS_BEFORE, 180, "hostA training")
                appeared = started = time.time()
                write_hosts(hosts_file, {"hostA": 1, "hostB": 1})
            else:
                job = Job(["--hosts-from-agents", "--api-port", "0", *common, *workload], verb="serve")
                jobs.append(job)
                address = str(job.wait_event("rendezvous.listening")["address"])
                jobs.append(Job(["--rendezvous", address, "--host", "hostA", "--slots", "1"], verb="agent"))
                job.wait_status(lambda s: s["world_size"] == 1 and s["steps"] >= STEPS_BEFORE, 180, "hostA training")
                started = time.time()
                warm = [] if way == "connect-warm" else ["--no-warm-join"]
                jobs.append(Job(["--rendezvous", address, "--host", "hostB", "--slots", "1", *warm], verb="agent"))
                appeared = float(job.wait_event("agent.connected", 120, host="hostB")["time"])
            first = wait_for(lambda: _first_step_at_two(d / "log"), 120, "a step at size 2")
            return {"from_appearance_s": first - appeared, "from_agent_start_s": first - started}
        finally:
            for j in reversed(jobs):
                j.kill()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"hostB (1 slot) added to a job training on hostA after {STEPS_BEFORE} steps; {args.rounds} round(s) each")
    print(f"{'way':<14} {'appeared -> step at 2 (s)':>26} {'agent start -> step at 2 (s)':>30}")
    for way in ("discovery", "connect-warm", "connect-cold"):
        rounds = [one_round(way) for _ in range(args.rounds)]
        seen = [r["from_appearance_s"] for r in rounds]
        start = [r["from_agent_start_s"] for r in rounds]
        print(f"{way:<14} {statistics.median(seen):>26.3f} {statistics.median(start):>30.3f}   "
              f"(each: {', '.join(f'{a:.2f}/{b:.2f}' for a, b in zip(seen, start))})", flush=True)


if __name__ == "__main__":
    main()
