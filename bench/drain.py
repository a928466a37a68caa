"""What taking a host costs: a drain with notice, SIGTERM to the host, SIGKILL of the host.

The same job each time (a real `ringmaster run`, 4 workers on 2 emulated hosts, a commit every
step, the same step time), and at the same point (step 40) hostB is taken one of three ways:
  - notice: its preemption notice script starts printing `drain 30`;
  - sigterm: SIGTERM to every process of the host (Kubernetes, Slurm, `kill -TERM -PGID`);
  - sigkill: SIGKILL to every process of the host (the baseline: what a host that dies costs).
For each it prints the steps redone (steps a worker began twice), the seconds from the signal
or notice until the host's workers were gone (the exit of the last one, as its agent reported
it), and the survivors' longest pause between two commits around it.

Run: python bench/drain.py [--rounds 3]
"""

from __future__ import annotations

import argparse
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

TAKE_AT_STEP = 40


def one_round(way: str) -> dict[str, float]:
    from harness import WORKLOADS, Job, events, read_logs, wait_for

    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        (d / "log").mkdir()
        notice = d / "notice"
        notice.write_text("")
        script = d / "notice.sh"
        script.write_text(f'#!/bin/sh\n[ "$RINGMASTER_HOST" = hostB ] && cat {notice}\nexit 0\n')
        script.chmod(0o755)
        job = Job(["-H", "hostA:2,hostB:2", "--min-np", "2", "--launcher", "local", "--preemption-notice-script",
                   str(script), "--notice-interval", "0.2", "--drain-grace", "30",
                   "python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(d / "log"), "--epochs", "1000",
                   "--samples", "256", "--step-time", "0.02", "--timestamps"])
        try:
            job.wait_status(lambda s: s["world_size"] == 4 and s["steps"] >= TAKE_AT_STEP, 180, "4 workers training")
            pid = next(h["agent_pid"] for h in job.status()["hosts"] if h["name"] == "hostB")
            taken_at = time.time()
            if way == "notice":
                notice.write_text("drain 30\n")
            else:
                os.killpg(pid, signal.SIGTERM if way == "sigterm" else signal.SIGKILL)
            job.wait_status(lambda s: s["world_size"] == 2, 120, "the job on hostA alone")

            def gone() -> float | None:
                exits = [e for e in job.events() if e.get("kind") in ("worker.exited",
                                                                      "worker.stopped", "worker.finished",
                                                                        "host.lost") and e.get("host") == "hostB"]
                return max(float(e["time"]) for e in exits) if len(exits) >= (1 if way == "sigkill" else 2) else None

            gone_at = wait_for(gone, 60, "hostB's workers gone")
            after = time.time()
            wait_for(lambda: len([r for r in events(read_logs(d / "log"), "commit")
                                  if r["size"] == 2 and r["time"] > after]) >= 20 or None, 120, "20 steps after")
            logs = read_logs(d / "log")
            redone = sum(len(b) - len(set(b)) for b in ([r["step"] for r in rs if r["event"] == "begin"]
                                                          for w, rs in logs.items() if w.startswith("hostA")))
            survivors = [w for w in logs if w.startswith("hostA")]
            gaps = []
            for w in survivors:
                times = [r["time"] for r in logs[w] if r["event"] == "commit" and taken_at - 1 < r["time"] < after + 5]
                gaps += [b - a for a, b in zip(times, times[1:])]
            return {"steps_redone": float(redone), "taken_to_gone_s": gone_at - taken_at,
                    "longest_pause_s": max(gaps) if gaps else float("nan")}
        finally:
            job.kill()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"hostB (2 of 4 workers) taken at step {TAKE_AT_STEP}; a commit every step; {args.rounds} round(s) each")
    print(f"{'way':<8} {'steps redone':>14} {'to gone (s)':>12} {'longest pause (s)':>18}")
    for way in ("notice", "sigterm", "sigkill"):
        rounds = [one_round(way) for _ in range(args.rounds)]
        redone = [r["steps_redone"] for r in rounds]
        gone = [r["taken_to_gone_s"] for r in rounds]
        pause = [r["longest_pause_s"] for r in rounds]
        print(f"{way:<8} {','.join(f'{x:g}' for x in redone):>14} {statistics.median(gone):>12.3f} "
              f"{statistics.median(pause):>18.3f}   (each: "
              f"{', '.join(f'{g:.3f}/{p:.3f}' for g, p in zip(gone, pause))})",
              flush=True)


if __name__ == "__main__":
    main()
