"""Goodput under chaos: one elastic job, a fault every few seconds for minutes, nothing lost.

Runs `tests/chaos.py`'s `ChaosRun` with a long seeded schedule of every fault kind (kills of
workers and hosts, stopped workers, hosts added and removed, `scale` down and up; with
`--store etcd` also SIGKILL + restart of `serve` and the kill of an etcd member), checks that
every sample of every epoch reached the committed model once, that no committed step was lost,
that the replicas were bit-identical after every sync and at the end, and that the final loss
is within reach of a fault-free run; then prints per fault kind how many were injected and
absorbed and the recovery seconds (p50/p99), the steps redone, and goodput (steps kept /
steps computed, and the fraction of wall time in which the job made progress).

Run: python bench/chaos.py [--seed N] [--faults 30] [--every 10] [--store memory|etcd]
A failing run prints its seed; the same seed replays the same schedule.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def main() -> int:
    from chaos import ETCD_KINDS, MEMORY_KINDS, ChaosRun, plan_faults

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--faults", type=int, default=30, help="faults to inject (default: %(default)s)")
    parser.add_argument("--every", type=float, default=10.0, help="mean seconds between faults (default: %(default)s)")
    parser.add_argument("--store", choices=["memory", "etcd"], default="memory")
    parser.add_argument("--step-time", type=float, default=0.05, help="simulated compute per step (default: "
                                                                      "%(default)s)")
    args = parser.parse_args()
    kinds = ETCD_KINDS if args.store == "etcd" else MEMORY_KINDS
    plan = plan_faults(args.seed, kinds, args.faults, args.every)
    print(f"seed {args.seed}: {len(plan)} faults, one every {args.every:g} s on average, store {args.store}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        run = ChaosRun(pathlib.Path(tmp), args.seed, plan, store=args.store, step_time_s=args.step_time,
                       say=lambda line: print(line, flush=True))
        try:
            report = run.run()
        except AssertionError as exc:
            print(f"FAILED (replay with --seed {args.seed} --faults {args.faults} --every {args.every:g} "
                  f"--store {args.store}): {exc}", flush=True)
            return 1
    print(report.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
