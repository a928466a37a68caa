"""A rendezvous that took a job over from the store judges its hosts' and workers' silence only
from when the slowest of them tries to reconnect at the latest (`LONGEST_GAP_S` after it began).

Driven without I/O (a manual clock, the coordinator's outbox), as the gRPC layer drives it.
"""

from __future__ import annotations

from coordinator_rig import Rig, record

from ringmaster.common.reconnect import LONGEST_GAP_S
from ringmaster.rendezvous.state import job_record

TIMEOUT_S = 4.0


def taken_over() -> tuple[Rig, list[str]]:
    """A job of two hosts, one worker each, carried on by a fresh rendezvous at its time 100."""
    leader = Rig(min_np=1, heartbeat_timeout_s=TIMEOUT_S)
    ids = leader.start_elastic({"a": 1, "b": 1})
    saved = job_record.read_job(record(leader))
    assert saved is not None
    standby = Rig(min_np=1, heartbeat_timeout_s=TIMEOUT_S)
    standby.now = 100.0
    standby.resume(saved)
    return standby, ids


def test_nobody_is_judged_silent_while_a_client_may_still_be_between_two_tries() -> None:
    assert LONGEST_GAP_S > 1.0  # (a client tries a refused address for a second before the next)
    rig, ids = taken_over()
    for beat in range(1, int(TIMEOUT_S) + 2):  # the agents are back; their workers are still between tries
        rig.now = 100.0 + beat  # (the last: past the timeout, not past the slowest retry)
        rig.agent_heartbeat("a")
        rig.agent_heartbeat("b")
        rig.tick()
    assert all(not rig.coordinator.workers[w].failed for w in ids)
    assert all(h.agent_connected for h in rig.coordinator.pool.hosts.values())
    assert rig.gen() is not None and rig.gen().number == 1


def test_a_client_that_never_comes_back_is_judged_once_that_window_is_over() -> None:
    rig, ids = taken_over()
    for beat in range(1, int(TIMEOUT_S + LONGEST_GAP_S) + 1):  # a and its worker came back; b and its worker did not
        rig.now = 100.0 + beat
        rig.agent_heartbeat("a")
        rig.worker_heartbeat(ids[0], 3, True)
        rig.tick()
        assert rig.coordinator.pool.hosts["b"].agent_connected, rig.now
    rig.now = 100.0 + TIMEOUT_S + LONGEST_GAP_S + 0.1
    rig.tick()
    assert not rig.coordinator.pool.hosts["b"].agent_connected
    assert rig.coordinator.pool.hosts["a"].agent_connected
    assert not rig.coordinator.workers[ids[0]].failed
    generation = rig.gen()
    assert generation is not None and [m.host for m in generation.members] == ["a"]


def test_workers_a_standby_restored_count_as_holding_the_last_commit() -> None:
    """Commit counts come with heartbeats and the store does not keep them: a failure before the
    survivors' first heartbeat to the new leader must not be taken for the loss of every commit."""
    leader = Rig(min_np=1, heartbeat_timeout_s=TIMEOUT_S)
    ids = leader.start_elastic({"a": 1, "b": 1})
    for wid in ids:
        leader.worker_heartbeat(wid, 40, True)
    saved = job_record.read_job(record(leader))
    assert saved is not None and saved.counters.steps == 40
    rig = Rig(min_np=1, heartbeat_timeout_s=TIMEOUT_S)
    rig.now = 100.0
    rig.resume(saved)
    rig.agent_heartbeat("a")
    rig.agent_disconnected("b")
    rig.worker_ready(ids[0], 1, "allreduce: Connection closed by peer", True)
    generation = rig.gen()
    assert generation is not None and generation.number == 2 and generation.member_ids == [ids[0]]
    assert rig.coordinator.summary.steps == 40 and not rig.coordinator.summary.warnings
