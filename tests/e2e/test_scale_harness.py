"""The scale harness at a small size (`bench/scale.py`): a real `ringmaster serve` against hosts
simulated by real protocol clients in two processes. What is asserted is correctness, not time:
after the first generation, a host lost, hosts added and half the hosts removed, every worker
that runs holds exactly one assignment of the newest generation, ranks 0..N-1 with each host's
workers together, and the generation numbers go up."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import scale  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_simulated_hosts_get_consistent_assignments_through_every_change(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(scale, "ADDED_HOSTS", 16)
    cluster = scale.Cluster(tmp_path, hosts=64, slots=4, store="memory", fleets=2, heartbeat_s=1.0, discovery_s=0.3)
    cluster.first_timeout_s = cluster.change_timeout_s = 120.0
    try:
        cluster.start()
        first = cluster.wait_settled(64 * 4, 0, 60, "the first generation")
        scale.check_assignments(cluster.assignments(), 64 * 4, first)
        changes = scale.run_changes(cluster)  # (each checked as it is measured)
        assert [c.workers for c in changes] == [63 * 4, 79 * 4, 39 * 4]
        numbers = [first] + [c.generation for c in changes]
        assert numbers == sorted(set(numbers)), numbers
        assert sum(s["refused"] for s in cluster.summaries()) == 0
    finally:
        cluster.close()
