"""A job's view lists the hosts and workers of the page asked for; its counts and totals are of
all of them, whatever the page (the metrics ask for no rows, the status for one page)."""

from __future__ import annotations

import collections

from coordinator_rig import Rig

from ringmaster.rendezvous.control.view import ALL_ROWS, HOST_STATES, NO_ROWS, HostView, WorkerView


def _mixed_job() -> Rig:
    """Hosts in several states: active ones, one lost (blacklisted), one whose agent is not
    there (unreachable), one warming a newcomer, one being drained."""
    rig = Rig(min_np=1, max_np=64, warmup_grace_s=600)
    rig.start_elastic({f"h{i}": 2 for i in range(6)})
    rig.now = 5.0
    rig.agent_disconnected("h5")  # lost: its workers fail, the host is blacklisted
    rig.set_hosts({**{f"h{i}": 2 for i in range(6)}, "late": 2, "new": 2})
    rig.agent_connected("new", 900)  # its newcomers start (warming)
    rig.drain_host("h0", 60.0)
    return rig


def test_counts_and_totals_are_of_every_row_whatever_the_page() -> None:
    rig = _mixed_job()
    full = rig.coordinator.view(rig.now, ALL_ROWS)
    summary = rig.coordinator.view(rig.now, NO_ROWS)
    assert summary.hosts == () and summary.workers == ()
    states = collections.Counter(h.state for h in full.hosts if h.state)
    expected_states = {state: states.get(state, 0) for state in HOST_STATES}
    assert full.host_state_counts() == summary.host_state_counts() == expected_states
    assert {s for s, n in expected_states.items() if n} >= {"active", "blacklisted",
                                                            "unreachable", "warming", "draining"}
    phases = collections.Counter(w.phase for w in full.workers if w.live)
    assert dict(full.worker_phases) == dict(summary.worker_phases) == dict(phases)
    assert (summary.hosts_total, summary.workers_total) == (len(full.hosts), len(full.workers))
    assert summary.members == full.members and summary.world_size == full.world_size > 0


def test_pages_put_together_are_the_whole_list() -> None:
    rig = _mixed_job()
    full = rig.coordinator.view(rig.now, ALL_ROWS)
    hosts: list[HostView] = []
    workers: list[WorkerView] = []
    for offset in range(0, max(len(full.hosts), len(full.workers)), 3):
        page = rig.coordinator.view(rig.now, (offset, 3))
        assert len(page.hosts) <= 3 and len(page.workers) <= 3
        hosts += page.hosts
        workers += page.workers
    assert tuple(hosts) == full.hosts and tuple(workers) == full.workers
    assert rig.coordinator.view(rig.now, (len(full.workers) + 5, 10)).workers == ()
