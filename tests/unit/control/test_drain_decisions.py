"""Drains decided without I/O: a host taken politely, at a commit, within a deadline."""

from __future__ import annotations

import math
from typing import Any, Mapping

import pytest
from coordinator_rig import Rig

from ringmaster.common.errors import Refused
from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.effects import EndGeneration, Retire, StopAgent, UpdateHosts
from ringmaster.rendezvous.control.records import DrainSource


def events(rig: Rig, kind: Kind) -> list[Mapping[str, Any]]:
    return [e.fields for e in rig.coordinator.summary.events if e.kind is kind]


def members(rig: Rig) -> list[str]:
    gen = rig.gen()
    assert gen is not None
    return [a.worker_id for a in gen.members]


def test_a_drained_host_leaves_at_the_next_commit_without_a_rollback_or_blacklist() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.drain_host("b", 30.0)
    update = rig.last(ids[0], UpdateHosts)
    assert update.reason == "host(s) leaving: b" and not update.checkpoint
    assert ids[1] in rig.specs("b")  # not stopped mid-step
    assert EndGeneration not in rig.kinds(ids[0])
    rig.commit_at_update(ids, 1)
    assert rig.kinds(ids[1])[-1] == Retire
    assert members(rig) == [ids[0]]
    rig.worker_exited("b", ids[1], 0, 0, False)
    (drained,) = events(rig, Kind.HOST_DRAINED)
    assert drained["host"] == "b" and drained["outcome"] == "commit"
    assert not rig.coordinator.pool.blacklist.is_blacklisted("b", rig.now)
    assert not events(rig, Kind.HOST_BLACKLISTED)
    assert "b" not in [h.name for h in rig.coordinator.pool.eligible_hosts(rig.now)]
    assert not isinstance(rig.agents["b"], StopAgent)  # an operator's drain keeps the agent


def test_an_undrained_host_comes_back() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.drain_host("b", 30.0)
    rig.commit_at_update(ids, 1)
    rig.worker_exited("b", ids[1], 0, 0, False)
    assert rig.undrain_host("b") is True
    assert events(rig, Kind.HOST_UNDRAINED)[0]["host"] == "b"
    newcomer = [w for w in rig.specs("b") if w not in ids]
    assert len(newcomer) == 1, "the host's slot is filled again"
    with pytest.raises(Refused, match="not being drained"):
        rig.undrain_host("b")


def test_a_deadline_that_passes_before_a_commit_stops_the_workers_and_the_others_roll_back() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.worker_heartbeat(ids[0], 5, True, steps_since_commit=7)
    rig.worker_heartbeat(ids[1], 5, True, steps_since_commit=-3)  # (input: no negative counts)
    rig.now = 2.0
    rig.drain_host("b", 10.0)
    rig.now = 11.9
    rig.tick()
    assert EndGeneration not in rig.kinds(ids[0])
    rig.now = 12.0
    rig.tick()
    assert EndGeneration in rig.kinds(ids[0]), "the survivors roll back to their last commit"
    assert Retire in rig.kinds(ids[1])
    rig.now += rig.coordinator.settings.stop_grace_s
    rig.tick()
    assert ids[1] not in rig.specs("b")
    rig.worker_exited("b", ids[1], 0, 15, True)
    (drained,) = events(rig, Kind.HOST_DRAINED)
    assert drained["outcome"] == "deadline" and drained["uncommitted_s"] == pytest.approx(12.0)
    assert drained["steps_lost"] == 7 and "7 step(s)" in drained["how"]
    assert not events(rig, Kind.HOST_BLACKLISTED)


def test_an_agents_own_drain_lets_it_go_and_its_session_closing_is_no_loss() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.drain_host("b", 25.0, source=DrainSource.SIGNAL, reason="SIGTERM", incarnation="incarnation-1")
    rig.commit_at_update(ids, 1)
    rig.worker_exited("b", ids[1], 0, 0, False)
    assert isinstance(rig.agents["b"], StopAgent)
    rig.agent_disconnected("b")
    assert not events(rig, Kind.HOST_LOST) and events(rig, Kind.HOST_LEFT)
    assert not rig.coordinator.pool.blacklist.is_blacklisted("b", rig.now)
    # The same host's next agent (a new process) starts it afresh: the old agent's drain is over.
    rig.agent_connected("b", 7, incarnation="incarnation-2")
    assert events(rig, Kind.HOST_UNDRAINED)[0]["why"] == "a new agent connected for it"
    assert [w for w in rig.specs("b") if w not in ids]


def test_a_drained_hosts_agent_closing_before_its_retired_workers_exit_report_is_no_loss() -> None:
    """The agent of a host taken politely exits right after its retired worker; its session may
    close before that worker's exit is reported (CI saw it: `host hB lost` 23 ms after the new
    ring formed). The host left: no loss, no blacklist, and the ring formed without it stands."""
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.drain_host("b", 25.0, source=DrainSource.SIGNAL, reason="SIGTERM", incarnation="incarnation-1")
    rig.commit_at_update(ids, 1)
    assert rig.kinds(ids[1])[-1] == Retire and members(rig) == [ids[0]]
    generation = rig.gen()
    rig.agent_disconnected("b")  # before the retired worker's exit report
    assert not events(rig, Kind.HOST_LOST) and events(rig, Kind.HOST_LEFT)
    assert not rig.coordinator.pool.blacklist.is_blacklisted("b", rig.now)
    assert rig.gen() is generation and EndGeneration not in rig.kinds(ids[0])


def test_a_withdrawn_notice_leaves_an_operators_drain() -> None:
    rig = Rig(min_np=1)
    rig.start_elastic({"a": 1, "b": 1})
    rig.drain_host("b", 60.0)
    rig.drain_host("b", 10.0, source=DrainSource.NOTICE, reason="spot notice", incarnation="x")
    assert rig.coordinator.pool.hosts["b"].drain.deadline_at == 10.0  # the earlier deadline holds
    assert rig.undrain_host("b", source=DrainSource.NOTICE) is False
    assert rig.coordinator.pool.hosts["b"].drain is not None


def test_a_drain_that_leaves_too_few_asks_for_a_durable_commit_first() -> None:
    rig = Rig(min_np=2, checkpoint_dir="/tmp/ckpt")
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.drain_host("b", 30.0)
    assert rig.last(ids[0], UpdateHosts).checkpoint and rig.last(ids[1], UpdateHosts).checkpoint
    rig2 = Rig(min_np=1)
    ids2 = rig2.start_elastic({"a": 1, "b": 1})
    rig2.drain_host("b", 30.0)
    assert not rig2.last(ids2[0], UpdateHosts).checkpoint


def test_draining_every_host_checkpoints_and_the_job_waits_for_hosts() -> None:
    rig = Rig(min_np=1, elastic_timeout_s=100)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.drain_host("a", 30.0)
    rig.drain_host("b", 30.0)
    assert rig.last(ids[0], UpdateHosts).checkpoint
    # (each member asks, once rank 0's checkpoint is written: none is placed on another's word)
    assert not any(rig.last(w, UpdateHosts).placed for w in ids)
    rig.commit_at_update(ids, 1)
    assert all(rig.kinds(w)[-1] == Retire for w in ids)  # at the reported commit, none asking
    for wid, host in zip(ids, "ab"):
        rig.worker_exited(host, wid, 0, 0, False)
    assert len(events(rig, Kind.HOST_DRAINED)) == 2
    assert rig.outcome() is None and events(rig, Kind.SLOTS_SHORT)
    rig.undrain_host("a")
    assert [w for w in rig.specs("a") if w not in ids], "undrained, the job starts again there"


@pytest.mark.parametrize("deadline, message", [
    (0, "positive"), (-5, "positive"), (math.inf, "positive"), (math.nan, "positive"), (1e9, "longer than a day"),
    ("10", "number of seconds"), (True, "number of seconds"),
])
def test_bad_deadlines_and_unknown_hosts_are_refused_naming_them(deadline, message) -> None:
    rig = Rig(min_np=1)
    rig.start_elastic({"a": 1, "b": 1})
    with pytest.raises(Refused, match=message):
        rig.drain_host("b", deadline)
    with pytest.raises(Refused, match="no host 'nope' in this job"):
        rig.drain_host("nope", 10.0)
    assert rig.coordinator.pool.hosts["b"].drain is None
