"""The scale guard: membership changes of a large job, measured in one run of `bench/scale.py`'s
cluster (a real `ringmaster serve`, memory store, hosts simulated by real protocol clients) and
set beside the values recorded in `bench/scale_guard.json`, each with the tolerance this noisy
2-core machine needs, as `bench/headline.py` does for README's figures:

- a host lost, 64 hosts added, half the hosts removed: seconds until every worker holds its
  assignment in the new generation, and the rendezvous' CPU seconds over each;
- the rendezvous' steady CPU (cores) and memory (RSS, MB) while nothing changes.

A figure worse than its recorded value by more than its tolerance is a regression: the line says
REGRESSED and the run exits 1. Run it before resolving anything that touches the rendezvous'
work per change; `--record` writes this run's figures as the new recorded values.

Run: python bench/scale_guard.py [--hosts 2048] [--record] [--recorded FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from headline import record, report  # noqa: E402
from scale import AFTERMATH_S, Cluster, run_changes, steady_state  # noqa: E402

RECORDED = ROOT / "bench" / "scale_guard.json"
#: The figures' names, in the order the changes are made (`scale.run_changes`).
CHANGES = ("host_lost", "hosts_added", "half_removed")


def measure(hosts: int, slots: int, steady_s: float, aftermath_s: float = AFTERMATH_S) -> dict[str, float]:
    """One cluster of `hosts` x `slots`: its steady state (from `aftermath_s` after the first
    generation settled), then the three changes."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(pathlib.Path(tmp), hosts, slots, "memory", fleets=2, heartbeat_s=1.0, discovery_s=0.5)
        try:
            cluster.start()
            steady = steady_state(cluster, steady_s, aftermath_s)
            changes = run_changes(cluster)
        finally:
            cluster.close()
    figures = {"steady_cores": steady["cpu_cores"], "steady_rss_mb": steady["rss_mb"]}
    for name, change in zip(CHANGES, changes):
        figures[f"{name}_s"] = change.seconds
        figures[f"{name}_cpu_s"] = change.server_cpu_s
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=None, help="hosts (default: the recorded size)")
    parser.add_argument("--steady-s", type=float, default=5.0, help="seconds of steady state measured")
    parser.add_argument("--aftermath-s", type=float, default=AFTERMATH_S,
                        help="seconds after the first generation before the steady state is measured")
    parser.add_argument("--recorded", type=pathlib.Path, default=RECORDED, help="the recorded values (JSON)")
    parser.add_argument("--record", action="store_true", help="write this run's figures into the recorded values")
    args = parser.parse_args()
    data = json.loads(args.recorded.read_text())
    recorded: dict[str, dict] = data["figures"]
    hosts, slots = args.hosts or data["hosts"], data["slots"]
    started = time.monotonic()
    print(f"measuring {hosts} x {slots} (minutes) ...", flush=True)
    figures = measure(hosts, slots, args.steady_s, args.aftermath_s)
    failed = report(figures, recorded)
    print(f"({time.monotonic() - started:.0f} s at {hosts} x {slots}; the recorded values: {args.recorded})")
    if args.record:
        record(args.recorded, figures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
