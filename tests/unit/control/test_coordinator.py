"""The rendezvous' decisions, driven without I/O: a manual clock and the coordinator's outbox."""

from __future__ import annotations

import pytest
from coordinator_rig import Rig, record

from ringmaster.common.errors import Refused
from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.effects import (
    AnnounceHosts,
    Assign,
    EndGeneration,
    EndJob,
    Retire,
    StopAgent,
    UpdateHosts,
)
from ringmaster.rendezvous.control.records import Phase
from ringmaster.settings import JobSettings


def test_first_generation_waits_for_every_agent_then_plans_ranks_in_env() -> None:
    rig = Rig(min_np=2)
    rig.set_hosts({"a": 2, "b": 2})
    rig.agent_connected("a", 11)
    assert rig.gen() is None
    rig.agent_connected("b", 12)
    gen = rig.coordinator.generation
    assert gen.number == 1 and len(gen.members) == 4
    env = {wid: spec.env for host in "ab" for wid, spec in rig.specs(host).items()}
    assert sorted(int(e["RANK"]) for e in env.values()) == [0, 1, 2, 3]
    assert {e["WORLD_SIZE"] for e in env.values()} == {"4"}
    assert {e["MASTER_PORT"] for e in env.values()} == {"1001"}
    assert all(e["RINGMASTER_GENERATION"] == "1" for e in env.values())
    assert list(rig.specs("a")[gen.members[0].worker_id].argv) == ["python", "train.py"]


def test_first_generation_starts_without_a_silent_host_after_the_start_timeout() -> None:
    rig = Rig(min_np=2, start_timeout_s=5)
    rig.set_hosts({"a": 2, "b": 2})
    rig.agent_connected("a", 11)
    rig.now = 4.9
    rig.tick()
    assert rig.gen() is None
    rig.now = 5.0
    rig.tick()
    assert [a.host for a in rig.coordinator.generation.members] == ["a", "a"]


def test_a_dead_worker_ends_the_generation_and_survivors_keep_their_order() -> None:
    rig = Rig(min_np=2)
    ids = rig.start_elastic({"a": 2, "b": 2})
    for wid in ids:
        assert rig.last(wid, Assign).generation == 1
    rig.worker_disconnected(ids[1])
    for wid in (ids[0], ids[2], ids[3]):
        assert rig.last(wid, EndGeneration).generation == 1
    rig.worker_exited("a", ids[1], 1, 0, False)
    assert rig.coordinator.pool.blacklist.is_blacklisted("a", rig.now)
    # a is blacklisted: its other worker must leave (its Ready is refused); b's two workers re-form
    with pytest.raises(Refused, match="is leaving the job"):
        rig.worker_ready(ids[0], 1, "allreduce failed", True)
    for wid in (ids[2], ids[3]):
        rig.worker_ready(wid, 1, "allreduce failed", True)
    assert rig.kinds(ids[0])[-1] == Retire
    gen = rig.coordinator.generation
    assert gen.number == 2
    assert [a.worker_id for a in gen.members] == [ids[2], ids[3]]
    assert rig.last(ids[2], Assign).place.rank == 0
    assert rig.coordinator.summary.resets == 1


def test_rank_zero_stays_rank_zero_when_it_survives() -> None:
    rig = Rig(min_np=2, max_np=8)
    ids = rig.start_elastic({"a": 1, "b": 1, "c": 1})
    rig.agent_disconnected("b")
    assert rig.coordinator.pool.blacklist.is_blacklisted("b", rig.now)
    rig.worker_ready(ids[2], 1, "allreduce failed", True)
    rig.worker_ready(ids[0], 1, "allreduce failed", True)
    assert [(a.worker_id, a.rank) for a in rig.coordinator.generation.members] == [(ids[0], 0), (ids[2], 1)]


def _newcomers_on_b(rig: Rig, slots: int) -> tuple[list[str], list[str]]:
    """A job on host a (2 workers) that host b joins with `slots` newcomers: (members, newcomers)."""
    ids = rig.start_elastic({"a": 2})
    rig.set_hosts({"a": 2, "b": slots})
    rig.agent_connected("b", 13)
    return ids, sorted(rig.specs("b"))


def test_newcomers_warm_up_before_the_ring_is_interrupted() -> None:
    rig = Rig(min_np=2, max_np=8)
    ids, newcomers = _newcomers_on_b(rig, 2)
    assert len(newcomers) == 2
    assert all(rig.specs("b")[w].env["RINGMASTER_GENERATION"] == "0" for w in newcomers)
    for wid in newcomers:
        rig.worker_connected(wid, 2)
    assert not any(UpdateHosts in rig.kinds(w) for w in ids)  # still warming up
    # ...but the members were told at once that newcomers are coming (Horovod's scripts wait for that)
    announced = [rig.last(w, AnnounceHosts) for w in ids]
    assert all(a.sequence == 1 and a.reason == f"new worker(s) warming up: {newcomers[0]}, {newcomers[1]}"
               for a in announced)
    rig.worker_ready(newcomers[0], 0, "", True)
    assert not any(UpdateHosts in rig.kinds(w) for w in ids)  # the other one is close behind
    rig.worker_ready(newcomers[1], 0, "", True)
    update = rig.last(ids[0], UpdateHosts)
    assert update.sequence == 2 and "new worker(s) ready" in update.reason
    for wid in ids:
        rig.worker_ready(wid, 1, "", True)
    gen = rig.coordinator.generation
    assert [a.worker_id for a in gen.members] == ids + newcomers
    assert all(rig.last(w, Assign).hosts_sequence == 2 for w in ids + newcomers)
    assert all(rig.kinds(w).count(AnnounceHosts) == 1 for w in ids)  # once


def test_members_that_await_the_announced_newcomers_reset_and_the_next_ring_waits_for_them() -> None:
    """Horovod's contract: a script that waits for the driver's word of new hosts (polling
    `state._host_messages`) gets it at once, resets at its next commit, and the next ring has
    the newcomers in it. The members' Ready says which announcement they reset for."""
    rig = Rig(min_np=2, max_np=8, start_timeout_s=20)
    ids, newcomers = _newcomers_on_b(rig, 2)
    for wid in newcomers:
        rig.worker_connected(wid, 2)
    announced = rig.last(ids[0], AnnounceHosts).sequence
    rig.worker_ready(ids[0], 1, "", True, awaits_hosts=announced)
    update = rig.last(ids[1], UpdateHosts)  # the other member is told to reset too
    assert update.sequence > announced and update.reason == "the workers awaited the announced hosts"
    rig.worker_ready(ids[1], 1, "", True, awaits_hosts=announced)
    assert rig.gen().number == 1  # every member ready, but the newcomers are still warming up
    rig.now += 5.0
    rig.tick()
    assert rig.gen().number == 1
    rig.worker_ready(newcomers[0], 0, "", True)
    assert rig.gen().number == 1
    rig.worker_ready(newcomers[1], 0, "", True)
    gen = rig.gen()
    assert gen.number == 2 and [a.worker_id for a in gen.members] == ids + newcomers
    assert all(rig.last(w, Assign).hosts_sequence == update.sequence for w in ids + newcomers)


def test_awaited_newcomers_are_waited_for_no_longer_than_the_start_timeout() -> None:
    rig = Rig(min_np=2, max_np=8, start_timeout_s=20)
    ids, newcomers = _newcomers_on_b(rig, 2)
    announced = rig.last(ids[0], AnnounceHosts).sequence
    for wid in ids:
        rig.worker_ready(wid, 1, "", True, awaits_hosts=announced)
    rig.now += 19.0
    rig.tick()
    assert rig.gen().number == 1
    rig.now += 1.5
    rig.tick()
    gen = rig.gen()
    assert gen.number == 2 and [a.worker_id for a in gen.members] == ids  # the newcomers join later


@pytest.mark.parametrize("claim", ["another number", "a non-member", "after an update"])
def test_a_ready_claiming_no_current_announcement_changes_nothing(claim: str) -> None:
    """`awaits_hosts` is input: only the current generation's announcement, from its member,
    before its update, makes the next ring wait."""
    rig = Rig(min_np=2, max_np=8, start_timeout_s=20)
    ids, newcomers = _newcomers_on_b(rig, 2)
    announced = rig.last(ids[0], AnnounceHosts).sequence
    if claim == "another number":
        rig.worker_ready(ids[0], 1, "", True, awaits_hosts=announced + 7)
    elif claim == "a non-member":
        rig.worker_connected(newcomers[0], 2)
        rig.worker_ready(newcomers[0], 1, "", True, awaits_hosts=announced)
    else:
        for wid in newcomers:
            rig.worker_connected(wid, 2)
            rig.worker_ready(wid, 0, "", True)
        rig.worker_ready(ids[0], 1, "", True, awaits_hosts=announced)
    assert rig.gen().awaited_at is None


def test_a_host_updates_reason_names_a_few_newcomers_and_counts_the_rest() -> None:
    # It goes to every member: listing every newcomer of a large job cost megabytes per message.
    rig = Rig(min_np=2, max_np=64)
    ids, newcomers = _newcomers_on_b(rig, 20)
    for wid in newcomers:
        rig.worker_connected(wid, 2)
    for wid in newcomers:
        rig.worker_ready(wid, 0, "", True)
    reason = rig.last(ids[0], UpdateHosts).reason
    assert reason.startswith("new worker(s) ready: ") and reason.endswith(", ... (20 in all)"), reason
    assert reason.count("b/") == 8


def test_a_lone_ready_newcomer_does_not_wait_past_the_grace() -> None:
    rig = Rig(min_np=1, max_np=8, warmup_grace_s=3)
    ids = rig.start_elastic({"a": 1})
    rig.set_hosts({"a": 1, "b": 2})
    rig.agent_connected("b", 13)
    first, second = sorted(rig.specs("b"))
    rig.worker_connected(first, 2)
    rig.worker_ready(first, 0, "", True)
    rig.now = 2.9
    rig.tick()
    assert UpdateHosts not in rig.kinds(ids[0])
    rig.now = 3.0
    rig.tick()
    assert UpdateHosts in rig.kinds(ids[0])


def test_removed_host_leaves_at_the_next_commit() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.set_hosts({"a": 1})
    assert rig.last(ids[0], UpdateHosts).reason == "host(s) leaving: b"
    assert ids[1] in rig.specs("b")  # not killed mid-step
    assert not rig.last(ids[0], UpdateHosts).placed and rig.last(ids[1], UpdateHosts).placed
    rig.worker_ready(ids[0], 1, "", True)  # it reports the commit: ids[1] is at it too, and leaves unasked
    assert rig.kinds(ids[1])[-1] == Retire
    assert [a.worker_id for a in rig.coordinator.generation.members] == [ids[0]]
    rig.now += rig.coordinator.settings.stop_grace_s
    rig.tick()
    assert ids[1] not in rig.specs("b")  # did not leave by itself: the agent stops it now


def test_a_host_that_keeps_fewer_slots_gives_up_its_highest_ones_at_the_next_commit() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 3, "b": 1})
    rig.set_hosts({"a": 2, "b": 1})  # a pool lent one of a's slots to another job
    assert rig.last(ids[0], UpdateHosts).reason == "fewer slots on a"
    on_a = sorted(rig.specs("a"))
    assert len(on_a) == 3  # not killed mid-step
    rig.commit_at_update(ids, 1)
    members = [a.worker_id for a in rig.coordinator.generation.members]
    assert len(members) == 3 and sum(1 for m in members if m.startswith("a/")) == 2
    (gone,) = [w for w in ids if w not in members]
    assert rig.kinds(gone)[-1] == Retire
    rig.now += rig.coordinator.settings.stop_grace_s
    rig.tick()
    assert len(rig.specs("a")) == 2 and gone not in rig.specs("a")
    rig.tick()
    assert len(rig.specs("a")) == 2  # no newcomer refills the slot it gave up


def test_below_min_np_fails_after_the_elastic_timeout_with_counts() -> None:
    rig = Rig(min_np=3, elastic_timeout_s=60, heartbeat_timeout_s=1000)
    ids = rig.start_elastic({"a": 2, "b": 1})
    rig.agent_disconnected("b")
    rig.now = 59
    rig.tick()
    assert rig.outcome() is None
    rig.now = 61
    rig.tick()
    outcome = rig.coordinator.outcome
    assert outcome is not None and not outcome.success
    assert "needs at least 3 workers (--min-np) but had only 2" in outcome.message
    assert isinstance(rig.agents["a"], StopAgent)
    assert rig.last(ids[0], EndJob).success is False


def test_a_killed_worker_on_the_last_host_spares_it_and_its_slot_is_refilled() -> None:
    rig = Rig(min_np=2)
    ids = rig.start_elastic({"localhost": 2})
    rig.worker_disconnected(ids[1])
    rig.worker_exited("localhost", ids[1], 0, 9, False)
    assert not rig.coordinator.pool.blacklist.is_blacklisted("localhost", rig.now)
    replacement = [w for w in rig.specs("localhost") if w not in ids]
    assert len(replacement) == 1
    rig.worker_ready(ids[0], 1, "peer died", True)
    rig.worker_connected(replacement[0], 3)
    rig.worker_ready(replacement[0], 0, "", True)
    assert [a.worker_id for a in rig.coordinator.generation.members] == [ids[0], replacement[0]]


@pytest.mark.parametrize("exit_code, signal_number, spare", [(1, 0, True), (0, 9, False)])
def test_the_last_host_is_blacklisted_as_horovod_does_and_the_job_fails(exit_code, signal_number, spare) -> None:
    """A worker that exits with an error (or any failure with --no-spare-last-hosts) blacklists
    its host whatever is left: with every host blacklisted the job fails at once, naming why."""
    rig = Rig(min_np=2, spare_last_hosts=spare)
    ids = rig.start_elastic({"localhost": 2})
    rig.worker_disconnected(ids[1])
    rig.worker_exited("localhost", ids[1], exit_code, signal_number, False)
    outcome = rig.coordinator.outcome
    assert outcome is not None and not outcome.success
    assert "every host is blacklisted" in outcome.message and f"worker {ids[1]}" in outcome.message
    assert "non-zero status" in outcome.message
    assert rig.last(ids[0], EndJob).success is False


def test_blacklisting_below_min_np_waits_the_elastic_timeout_then_fails() -> None:
    rig = Rig(min_np=4, elastic_timeout_s=3)
    ids = rig.start_elastic({"a": 2, "b": 2})
    rig.worker_disconnected(ids[0])
    rig.worker_exited("a", ids[0], 1, 0, False)
    assert rig.coordinator.pool.blacklist.is_blacklisted("a", rig.now)
    assert rig.outcome() is None  # b is still usable: wait for slots
    rig.now = 3.5
    rig.tick()
    assert "needs at least 4 workers (--min-np) but had only 2" in rig.coordinator.outcome.message


def test_a_crashed_worker_stopped_by_its_agent_still_blacklists_its_host() -> None:
    """The agent may SIGTERM a worker the rendezvous already dropped (it crashed): what counts
    is that the rendezvous did not ask for the stop (the race of an agent tidying up)."""
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.worker_disconnected(ids[1])
    rig.worker_exited("b", ids[1], 1, 0, True)
    assert rig.coordinator.pool.blacklist.is_blacklisted("b", rig.now)


def test_a_crashing_worker_is_left_to_exit_by_itself_for_a_while() -> None:
    """Its agent is not told to stop it (a SIGTERM would hide the exit status that decides the
    blacklist) until `exit_report_timeout_s` has passed."""
    rig = Rig(min_np=1, exit_report_timeout_s=3)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.worker_disconnected(ids[1])
    assert ids[1] in rig.specs("b")
    rig.now = 3.5
    rig.tick()
    assert ids[1] not in rig.specs("b")


def test_one_failure_is_one_reset_the_ring_waits_for_the_exit_status() -> None:
    rig = Rig(min_np=2, max_np=4)
    ids = rig.start_elastic({"a": 2, "b": 2})
    rig.worker_disconnected(ids[0])  # rank 0 crashed; its exit status is still on its way
    for wid in ids[1:]:
        rig.worker_ready(wid, 1, "peer closed the connection", True)
    assert rig.coordinator.generation.number == 1  # no ring yet: is host a to be blacklisted?
    assert [w for w in rig.specs("a") if w not in ids] == []  # and its slot is not refilled meanwhile
    rig.now = 0.8
    rig.worker_exited("a", ids[0], 1, 0, False)
    gen = rig.coordinator.generation
    assert gen.number == 2 and [a.worker_id for a in gen.members] == [ids[2], ids[3]]
    assert rig.kinds(ids[1])[-1] == Retire
    assert rig.coordinator.summary.resets == 1


def test_an_exit_status_that_never_comes_holds_the_ring_back_only_for_a_while() -> None:
    rig = Rig(min_np=2, max_np=4, exit_report_timeout_s=2)
    ids = rig.start_elastic({"a": 2, "b": 2})
    rig.worker_disconnected(ids[3])
    for wid in ids[:3]:
        rig.worker_ready(wid, 1, "x", True)
    assert rig.coordinator.generation.number == 1
    rig.now = 2.5
    rig.tick()
    assert [a.worker_id for a in rig.coordinator.generation.members] == ids[:3]


def test_rank_zero_is_on_the_first_listed_host_whichever_agent_connects_first() -> None:
    rig = Rig(min_np=2, max_np=2)
    rig.set_hosts({"first": 2, "second": 2})
    rig.agent_connected("second", 2)
    assert rig.gen() is None  # second alone could hold max_np, but rank 0 belongs on first
    rig.agent_connected("first", 1)
    assert {a.host for a in rig.coordinator.generation.members} == {"first"}
    ids = [a.worker_id for a in rig.coordinator.generation.members]
    env = rig.specs("first")[ids[0]].env
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_HOSTNAME"]) == ("0", "2", "first")
    assert (env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"], env["HOROVOD_CROSS_RANK"]) == ("0", "2", "0")


def test_a_newcomer_starts_with_horovods_variables_for_its_expected_place() -> None:
    rig = Rig(min_np=1, max_np=4)
    ids = rig.start_elastic({"a": 2})
    rig.set_hosts({"a": 2, "b": 2})
    rig.agent_connected("b", 7)
    newcomers = sorted(rig.specs("b").values(), key=lambda s: s.slot)
    assert [(s.env["HOROVOD_RANK"], s.env["HOROVOD_SIZE"], s.env["HOROVOD_LOCAL_RANK"], s.env["HOROVOD_CROSS_RANK"])
            for s in newcomers] == [("2", "4", "0", "1"), ("3", "4", "1", "1")]
    assert all(s.env["HOROVOD_HOSTNAME"] == "b" for s in newcomers) and len(ids) == 2


def test_survivors_inside_elastic_run_are_told_they_rejoin_and_are_placed_unasked() -> None:
    """The end of a generation says `rejoin` to a survivor inside `hvd.elastic.run` (it is placed
    in the next without its `Ready`, which at 32,768 workers costs the rendezvous seconds), not
    to one that has not entered it yet (it must ask)."""
    rig = Rig(min_np=2)
    ids = rig.start_elastic({"a": 1, "b": 2, "c": 1})
    rig.coordinator.workers[ids[3]].elastic = False  # (still setting up: outside hvd.elastic.run)
    rig.worker_disconnected(ids[0])
    assert [rig.last(w, EndGeneration).rejoin for w in ids[1:]] == [True, True, False]
    rig.worker_exited("a", ids[0], 1, 0, False)  # (the next ring waited for its status)
    assert rig.gen().number == 1  # ... and waits for c's worker to ask
    rig.worker_ready(ids[3], 1, "allreduce failed", False)
    assert [rig.last(w, Assign).generation for w in ids[1:]] == [2, 2, 2]  # b's two never asked


def test_exit_zero_without_returning_is_not_success() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.worker_exited("b", ids[1], 0, 0, False)
    assert rig.outcome() is None
    assert rig.coordinator.workers[ids[1]].failed == "exited with code 0"
    assert not rig.coordinator.pool.blacklist.is_blacklisted("b", rig.now)
    assert rig.last(ids[0], EndGeneration).generation == 1


def test_job_succeeds_when_the_training_function_returned_everywhere() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 2})
    for wid in ids:
        rig.worker_done(wid, 42)
    assert rig.outcome() is None  # still running until they exit
    for wid in ids:
        rig.worker_disconnected(wid)
        rig.worker_exited("a", wid, 0, 0, False)
    assert rig.coordinator.outcome.success
    assert rig.coordinator.summary.steps == 42


def test_a_finished_job_does_not_wait_for_newcomers_still_starting() -> None:
    rig = Rig(min_np=1, max_np=4)
    ids = rig.start_elastic({"a": 2})
    rig.set_hosts({"a": 2, "b": 2})
    rig.agent_connected("b", 7)
    newcomers = list(rig.specs("b"))
    assert len(newcomers) == 2  # spawned, still importing torch
    for wid in ids:
        rig.worker_done(wid, 5)
    assert all(rig.coordinator.workers[w].stopping for w in newcomers)
    assert rig.specs("b") == {}  # their agent stops them now
    for wid in ids:
        rig.worker_exited("a", wid, 0, 0, False)
    for wid in newcomers:
        rig.worker_exited("b", wid, 0, 15, True)
    assert rig.coordinator.outcome.success


def test_reset_limit() -> None:
    rig = Rig(min_np=1, reset_limit=1)
    ids = rig.start_elastic({"a": 1, "b": 1, "c": 1})
    rig.agent_disconnected("c")
    rig.worker_ready(ids[0], 1, "x", True)
    rig.worker_ready(ids[1], 1, "x", True)
    assert rig.coordinator.generation.number == 2
    rig.agent_disconnected("b")
    rig.worker_ready(ids[0], 2, "x", True)
    assert not rig.coordinator.outcome.success
    assert "reset 2 is needed but --reset-limit is 1" in rig.coordinator.outcome.message


def test_a_worker_without_heartbeats_is_failed_and_its_host_blacklisted() -> None:
    rig = Rig(min_np=1, heartbeat_timeout_s=5)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.now = 4
    rig.agent_heartbeat("a")
    rig.agent_heartbeat("b")
    rig.worker_heartbeat(ids[0], 3, True)
    rig.now = 6
    rig.tick()
    assert "no heartbeat for 6.0 s" in rig.coordinator.workers[ids[1]].failed
    assert rig.coordinator.pool.blacklist.is_blacklisted("b", rig.now)
    assert rig.last(ids[0], EndGeneration).generation == 1
    assert ids[1] not in rig.specs("b")  # its agent kills it


def test_a_worker_whose_training_returned_may_go_quiet_as_it_exits_until_the_busy_timeout() -> None:
    """Its process winds down after `ReportDone` (seconds on a loaded machine: a CI run counted
    such a worker failed and SIGTERMed it while the job waited for a peer to exit); a silence
    past --busy-timeout is still a hang."""
    rig = Rig(min_np=1, heartbeat_timeout_s=5, busy_timeout_s=60)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.now = 1
    rig.worker_done(ids[1], 3)
    for beat_at in range(1, 63):  # (its peer still trains, beating; the finished one is silent)
        rig.now = beat_at
        rig.agent_heartbeat("a")
        rig.agent_heartbeat("b")
        rig.worker_heartbeat(ids[0], 3, True)
        rig.tick()
        if beat_at == 59:
            assert rig.coordinator.workers[ids[1]].failed is None and rig.coordinator.workers[ids[1]].live
    assert "no heartbeat for 61.0 s" in rig.coordinator.workers[ids[1]].failed


def test_every_host_silent_at_once_is_waited_for_as_the_rendezvous_may_be_cut_off() -> None:
    rig = Rig(min_np=1, heartbeat_timeout_s=5, reconnect_timeout_s=60)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.now = 4.0
    rig.agent_heartbeat("a")
    rig.now = 4.9
    rig.agent_heartbeat("b")  # then nothing from anyone: a partition around the rendezvous, most likely
    rig.now = 9.1  # a is past the timeout, b not quite: they went silent together all the same
    rig.tick()
    assert rig.coordinator.pool.hosts["a"].agent_connected
    rig.now = 20
    rig.tick()
    assert all(rig.coordinator.workers[w].failed is None for w in ids)
    assert all(h.agent_connected for h in rig.coordinator.pool.hosts.values())
    assert [e for e in rig.coordinator.summary.events if e.kind is Kind.RENDEZVOUS_ISOLATED]
    rig.now = 30  # the link heals: a comes back first, b a moment later; nobody is counted lost
    rig.agent_heartbeat("a")
    rig.tick()
    rig.now = 33
    rig.agent_heartbeat("b")
    for wid in ids:
        rig.worker_heartbeat(wid, 5, True)
    rig.tick()
    assert all(rig.coordinator.workers[w].failed is None for w in ids)
    assert rig.coordinator.generation.number == 1 and rig.coordinator.generation.over is None
    assert [e for e in rig.coordinator.summary.events if e.kind is Kind.RENDEZVOUS_REJOINED]


def test_hosts_silent_past_the_reconnect_window_are_lost_and_one_silent_host_is_lost_at_once() -> None:
    rig = Rig(min_np=1, heartbeat_timeout_s=5, reconnect_timeout_s=60)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.now = 70  # longer than the agents wait for us: they have stopped their workers by now
    rig.tick()
    assert not any(h.agent_connected for h in rig.coordinator.pool.hosts.values())
    single = Rig(min_np=1, heartbeat_timeout_s=5, reconnect_timeout_s=60)
    ids = single.start_elastic({"a": 1, "b": 1})
    single.now = 6
    single.agent_heartbeat("a")
    single.worker_heartbeat(ids[0], 1, True)
    single.tick()  # only b is silent: a host problem, judged at once
    assert not single.coordinator.pool.hosts["b"].agent_connected


def test_blacklisted_host_returns_after_its_cooldown() -> None:
    rig = Rig(min_np=1, blacklist_cooldown_s=(10, 20))
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.agent_disconnected("b")
    rig.worker_ready(ids[0], 1, "x", True)
    assert rig.coordinator.capacity(rig.now) == 1
    rig.now = 12
    rig.agent_connected("b", 99)
    assert rig.coordinator.capacity(rig.now) == 2
    assert len(rig.specs("b")) == 1  # a newcomer starts there


def test_plain_scripts_are_restarted_as_a_whole() -> None:
    rig = Rig(min_np=2, max_restarts=1)
    rig.set_hosts({"a": 2})
    rig.agent_connected("a", 1)
    first = sorted(rig.specs("a"))
    rig.worker_exited("a", first[0], 0, 9, False)  # killed: the host is spared, the job restarts
    assert rig.specs("a") == {} or set(rig.specs("a")) <= set(first)
    assert rig.coordinator.workers[first[1]].stopping
    rig.now = 1
    rig.tick()
    assert first[1] not in rig.specs("a")
    rig.worker_exited("a", first[1], 0, 15, True)
    second = sorted(rig.specs("a"))
    assert len(second) == 2 and not set(second) & set(first)
    assert rig.coordinator.generation.number == 2
    assert rig.plain_stores == [1, 2]
    assert {rig.specs("a")[w].env["TORCHELASTIC_RESTART_COUNT"] for w in second} == {"1"}


def test_a_plain_job_fails_on_a_workers_error_unless_restarts_are_allowed() -> None:
    """As torchrun (--max-restarts 0) and horovodrun: a plain job whose worker fails fails, saying
    why and what to do; with --max-restarts N it restarts N times, then fails."""
    rig = Rig(min_np=2)
    rig.set_hosts({"a": 2})
    rig.agent_connected("a", 1)
    first = sorted(rig.specs("a"))
    rig.worker_exited("a", first[1], 3, 0, False)
    outcome = rig.coordinator.outcome
    assert outcome is not None and not outcome.success
    assert f"worker {first[1]} on a exited with code 3 (--max-restarts 0)" in outcome.message
    assert "--max-restarts N" in outcome.message and rig.coordinator.generation.number == 1

    twice = Rig(min_np=1, max_restarts=2)
    twice.set_hosts({"a": 1})
    twice.agent_connected("a", 1)
    for attempt in range(3):
        (wid,) = twice.specs("a")
        twice.now += 20  # each ran a while: no crash loop
        twice.worker_exited("a", wid, 3, 0, False)
        assert (twice.coordinator.outcome is None) == (attempt < 2), attempt
    assert "after 2 restart(s)" in twice.coordinator.outcome.message


def test_a_plain_workers_crash_with_a_traceback_is_restarted_and_a_command_that_cannot_start_is_not() -> None:
    """A plain script never connects, so its crash says nothing of the command: a rank's
    traceback (or a peer's "connection closed" after the failing rank died, whichever the agents
    report first: CI saw that order) restarts the job within --max-restarts, as torchrun does.
    A command that cannot start (exit 2, 126, 127 with Python's or the shell's words) fails it at
    once even with restarts left, naming the command."""
    rig = Rig(min_np=2, max_restarts=1)
    rig.set_hosts({"a": 2})
    rig.agent_connected("a", 1)
    first = sorted(rig.specs("a"))
    rig.worker_exited("a", first[0], 1, 0, False, output="RuntimeError: Connection closed by peer [127.0.0.1]:18623")
    assert rig.coordinator.outcome is None
    rig.now = 1
    rig.tick()
    rig.worker_exited("a", first[1], 1, 0, False)
    assert rig.coordinator.outcome is None and rig.coordinator.generation.number == 2
    second = sorted(rig.specs("a"))
    rig.now = 30
    rig.worker_exited("a", second[0], 1, 0, False, output="ValueError: a bug at step 40")  # no restart left
    outcome = rig.coordinator.outcome
    assert outcome is not None and not outcome.success and "a bug at step 40" in outcome.message

    typo = Rig(min_np=2, max_restarts=3)
    typo.set_hosts({"a": 2})
    typo.agent_connected("a", 1)
    wid = sorted(typo.specs("a"))[0]
    typo.worker_exited("a", wid, 2, 0, False, output="python: can't open file '/x/trian.py': [Errno 2] No such file")
    outcome = typo.coordinator.outcome
    assert (
        outcome is not None and "before it reached the rendezvous" in outcome.message and "trian.py" in outcome.message
    )
    assert typo.coordinator.generation.number == 1


def test_any_plain_workers_error_fails_the_job_even_after_another_finished() -> None:
    """Rank 0 exits 0, then rank 1 exits 3: the job failed (a scheduler or CI reads the code)."""
    rig = Rig(min_np=2, max_restarts=5)
    rig.set_hosts({"a": 2})
    rig.agent_connected("a", 1)
    first, second = sorted(rig.specs("a"))
    rig.worker_exited("a", first, 0, 0, False)
    assert rig.coordinator.outcome is None
    rig.worker_exited("a", second, 3, 0, False)
    outcome = rig.coordinator.outcome
    assert outcome is not None and not outcome.success and "after another worker had finished" in outcome.message


def test_plain_job_finishes_when_workers_exit_zero() -> None:
    rig = Rig(min_np=2)
    rig.set_hosts({"a": 2})
    rig.agent_connected("a", 1)
    for wid in sorted(rig.specs("a")):
        rig.worker_exited("a", wid, 0, 0, False)
    assert rig.coordinator.outcome.success


def test_crash_loop_stops_the_job() -> None:
    rig = Rig(min_np=1, crash_loop_limit=3, crash_loop_window_s=10, max_restarts=10)
    rig.set_hosts({"a": 1})
    rig.agent_connected("a", 1)
    for _ in range(3):
        (wid,) = rig.specs("a")
        rig.now += 1
        rig.worker_exited("a", wid, 0, 9, False)  # killed each time: the last host is spared
    assert not rig.coordinator.outcome.success
    assert "3 generations in a row failed within 10 s" in rig.coordinator.outcome.message


def test_short_generations_that_committed_steps_are_no_crash_loop() -> None:
    """Five single-worker kills a few seconds apart, each generation training in between: the
    job goes on (before, the fifth failure ended it as a crash loop)."""
    rig = Rig(min_np=1, max_np=4, crash_loop_limit=3, crash_loop_window_s=10)
    ids = rig.start_elastic({"a": 4})
    steps = 0
    for round in range(5):
        members = rig.coordinator.generation.member_ids
        number = rig.coordinator.generation.number
        steps += 40
        rig.now += 1
        rig.worker_heartbeat(members[0], steps, True)  # rank 0 committed steps in this generation
        rig.now += 2
        victim = members[-1]
        rig.worker_disconnected(victim)
        rig.worker_exited("a", victim, 0, 9, False)
        for wid in members[:-1]:  # (placed in the next generation already: these are answered)
            rig.worker_ready(wid, number, "peer died", True)
        for newcomer in [w for w in rig.specs("a") if rig.coordinator.workers[w].phase.value == "spawning"]:
            rig.worker_connected(newcomer, 9)
            rig.worker_ready(newcomer, 0, "", True)
        assert rig.outcome() is None, rig.outcome()
    assert rig.coordinator.generation.number == 6 and ids[0] in rig.coordinator.generation.member_ids


def test_unknown_worker_is_refused() -> None:
    rig = Rig(min_np=1)
    rig.start_elastic({"a": 1})
    with pytest.raises(Refused, match="not part of this job"):
        rig.worker_connected("ghost/1", 1)
    with pytest.raises(Refused, match="not part of this job"):
        rig.worker_ready("ghost/1", 0, "", True)


def test_in_groups_a_killed_worker_takes_its_group_out_and_its_partner_waits_for_the_refill() -> None:
    """--group-size 2, one host of 4 (a kill spares the last host): the survivors' whole group
    goes on at once; the killed worker's partner is not retired but waits; once the refilled
    slot's worker is ready the ring grows back by a whole group, at the survivors' next commit."""
    rig = Rig(min_np=2, max_np=4, group_size=2)
    ids = rig.start_elastic({"h": 4})
    assert all(spec.env["RINGMASTER_GROUP_SIZE"] == "2" for spec in rig.specs("h").values())
    rig.worker_disconnected(ids[3])
    rig.worker_exited("h", ids[3], 0, 9, False)
    gen = rig.gen()
    assert gen.number == 2 and [a.worker_id for a in gen.members] == ids[:2]  # placed unasked, at once
    assert Retire not in rig.kinds(ids[2])
    told = [e for e in rig.worker_events[ids[2]] if isinstance(e, EndGeneration)]
    # told it was placed unasked, then (left over) to ask after all: it may still be inside
    # generation 1's collectives, and a ring formed with it would wait for it
    assert [(e.generation, e.rejoin) for e in told] == [(1, True), (1, False)]
    assert rig.coordinator.workers[ids[2]].phase is Phase.WARMING
    refill = [w for w in rig.specs("h") if w not in ids]
    assert len(refill) == 1
    rig.worker_connected(refill[0], 3)
    assert not any(UpdateHosts in rig.kinds(w) for w in ids[:2])
    rig.worker_ready(refill[0], 0, "", True)
    rig.now += rig.coordinator.settings.warmup_grace_s + 1  # (half a group is ready, the partner has not asked)
    rig.tick()
    assert not any(UpdateHosts in rig.kinds(w) for w in ids[:2])  # the survivors train on
    rig.worker_ready(ids[2], 1, "allgather: timed out", True)  # out of generation 1 at last: it asks
    assert rig.coordinator.workers[ids[2]].phase is Phase.READY
    assert "new worker(s) ready" in rig.last(ids[0], UpdateHosts).reason
    for wid in ids[:2]:
        rig.worker_ready(wid, 2, "", True)
    assert [a.worker_id for a in rig.gen().members] == [*ids[:3], refill[0]]


def test_in_groups_newcomers_start_and_join_as_whole_groups() -> None:
    rig = Rig(min_np=2, max_np=6, group_size=2)
    ids = rig.start_elastic({"a": 2})
    rig.set_hosts({"a": 2, "b": 1})  # one slot more: no whole group, so nobody is started there
    rig.agent_connected("b", 13)
    assert rig.specs("b") == {}
    rig.set_hosts({"a": 2, "b": 1, "c": 1})  # a second: one group over b and c
    rig.agent_connected("c", 14)
    assert len(rig.specs("b")) == len(rig.specs("c")) == 1
    newcomers = [*rig.specs("b"), *rig.specs("c")]
    rig.worker_connected(newcomers[0], 2)
    rig.worker_ready(newcomers[0], 0, "", True)
    rig.now += 60
    rig.tick()
    assert not any(UpdateHosts in rig.kinds(w) for w in ids) and rig.gen().number == 1  # half a group ready
    rig.worker_connected(newcomers[1], 3)
    rig.worker_ready(newcomers[1], 0, "", True)
    assert "new worker(s) ready" in rig.last(ids[0], UpdateHosts).reason
    for wid in ids:
        rig.worker_ready(wid, 1, "", True)
    assert [a.worker_id for a in rig.gen().members] == [*ids, *newcomers]


def test_in_groups_the_first_generation_and_a_scale_request_are_whole_groups() -> None:
    rig = Rig(min_np=2, group_size=2)
    ids = rig.start_elastic({"a": 3, "b": 3})
    gen = rig.gen()
    assert len(gen.members) == 6
    assert [a.host for a in gen.members] == ["a", "a", "b", "b", "a", "b"]  # the pair that must span two hosts last
    with pytest.raises(Refused, match="groups of 2"):
        rig.scale(3)
    rig.scale(4)
    assert ids


@pytest.mark.parametrize("kwargs, message", [
    ({"min_np": 3, "group_size": 2}, "--min-np 3 is not a whole number of groups of --group-size 2: give 2 or 4"),
    ({"min_np": 2, "max_np": 5, "group_size": 2}, "--max-np 5 is not a whole number of groups of --group-size 2"),
    ({"min_np": 4, "max_np": 2}, "--max-np (2) must be at least --min-np (4)"),
    ({"heartbeat_interval_s": 5, "heartbeat_timeout_s": 2}, "must exceed the heartbeat interval"),
])
def test_settings_are_validated(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        JobSettings(**kwargs)


def test_phases_follow_the_lifecycle() -> None:
    rig = Rig(min_np=1, max_np=4)
    ids = rig.start_elastic({"a": 1})
    assert rig.coordinator.workers[ids[0]].phase is Phase.MEMBER
    rig.set_hosts({"a": 1, "b": 1})
    rig.agent_connected("b", 2)
    (newcomer,) = rig.specs("b")
    assert rig.coordinator.workers[newcomer].phase is Phase.SPAWNING
    rig.worker_connected(newcomer, 5)
    assert rig.coordinator.workers[newcomer].phase is Phase.WARMING
    rig.worker_ready(newcomer, 0, "", True)
    assert rig.coordinator.workers[newcomer].phase is Phase.READY


def test_scale_down_then_up_keeps_rank_zero_and_refills() -> None:
    rig = Rig(min_np=1, max_np=8)
    ids = rig.start_elastic({"a": 2, "b": 2})
    with pytest.raises(Refused, match="cannot scale to 9 workers: --max-np is 8"):
        rig.scale(9)
    with pytest.raises(Refused, match="cannot scale to 0 workers: --min-np is 1"):
        rig.scale(0)
    rig.scale(2)
    assert rig.last(ids[0], UpdateHosts).reason == "scaling down to 2 workers"
    rig.commit_at_update(ids, 1)
    assert [a.worker_id for a in rig.coordinator.generation.members] == ids[:2]
    assert rig.kinds(ids[2])[-1] == Retire and rig.kinds(ids[3])[-1] == Retire
    for wid in ids[2:]:
        rig.worker_exited("b", wid, 0, 0, False)
    assert rig.specs("b") == {}  # no newcomer fills the freed slots
    rig.scale(3)
    (newcomer,) = rig.specs("b")
    rig.worker_connected(newcomer, 9)
    rig.worker_ready(newcomer, 0, "", True)
    rig.commit_at_update(ids[:2], 2)
    assert [a.worker_id for a in rig.coordinator.generation.members] == ids[:2] + [newcomer]


def test_plain_job_scaled_down_restarts_smaller() -> None:
    rig = Rig(min_np=1)
    rig.set_hosts({"a": 3})
    rig.agent_connected("a", 1)
    first = sorted(rig.specs("a"))
    rig.scale(2)
    rig.now = 1
    rig.tick()
    for wid in first:
        rig.worker_exited("a", wid, 0, 15, True)
    assert len(rig.specs("a")) == 2 and rig.coordinator.generation.number == 2


def test_retiring_workers_are_never_taken_back() -> None:
    """Scale down then straight up again: the leaving workers are not counted as ready newcomers."""
    rig = Rig(min_np=1, max_np=4)
    ids = rig.start_elastic({"a": 2, "b": 2})
    rig.scale(2)
    rig.commit_at_update(ids, 1)
    rig.scale(4)  # before b's retiring workers have exited
    fresh = sorted(set(rig.specs("b")) - set(ids))
    assert len(fresh) == 2
    assert UpdateHosts not in rig.kinds(ids[0])[-1:]  # nobody ready to join yet
    for wid in fresh:
        rig.worker_connected(wid, 7)
        rig.worker_ready(wid, 0, "", True)
    rig.commit_at_update(ids[:2], 2)
    assert [a.worker_id for a in rig.coordinator.generation.members] == ids[:2] + fresh


def test_a_member_that_exits_ends_its_generation_even_when_stopped_on_purpose() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 2})
    rig.worker_exited("a", ids[1], 0, 15, True)
    assert rig.last(ids[0], EndGeneration).generation == 1
    assert rig.last(ids[0], EndGeneration).reason == f"member {ids[1]} on a was killed by signal 15 (SIGTERM)"
    assert rig.coordinator.generation.number == 2  # the survivor placed in the next at once


def test_agent_of_a_departed_host_leaves_without_blame() -> None:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.set_hosts({"a": 1})
    rig.commit_at_update(ids, 1)
    rig.worker_exited("b", ids[1], 0, 0, False)
    rig.agent_disconnected("b")
    assert not rig.coordinator.pool.blacklist.is_blacklisted("b", rig.now)
    assert rig.coordinator.summary.events[-1].message == "agent for host b stopped: the host left the job"


def test_a_plain_worker_finishing_first_does_not_stop_its_peers() -> None:
    rig = Rig(min_np=2)
    rig.set_hosts({"a": 3})
    rig.agent_connected("a", 1)
    first, *others = sorted(rig.specs("a"))
    rig.worker_exited("a", first, 0, 0, False)
    assert rig.coordinator.generation.over is None
    assert not any(rig.coordinator.workers[w].stopping for w in others)
    assert set(others) <= set(rig.specs("a"))  # still wanted: they finish in their own time


def test_agents_that_said_hello_and_vanished_are_forgotten_and_events_stay_bounded() -> None:
    from ringmaster.rendezvous.control.host_pool import FORGET_DEPARTED_HOST_S
    from ringmaster.rendezvous.control.records import MAX_EVENTS

    rig = Rig(min_np=1)
    rig.start_elastic({"a": 1})
    for i in range(5000):
        rig.coordinator.agent_connected(f"stray{i}", i, rig.now)
        rig.coordinator.agent_disconnected(f"stray{i}", rig.now)
    rig.coordinator.settle(rig.now)
    assert len(rig.coordinator.pool.hosts) == 5001
    summary = rig.coordinator.summary
    assert len(summary.events) == MAX_EVENTS and summary.events_dropped > 9000
    rig.now = FORGET_DEPARTED_HOST_S + 1
    rig.agent_heartbeat("a")
    rig.worker_heartbeat(rig.coordinator.generation.member_ids[0], 3, True)
    rig.tick()
    assert list(rig.coordinator.pool.hosts) == ["a"]  # the job's own host stays
    assert "stray1" not in record(rig)


def test_a_restart_without_a_checkpoint_says_how_many_steps_are_lost() -> None:
    from ringmaster.cli.main import summary_events
    from ringmaster.common.events import Kind
    from ringmaster.rendezvous.control.records import JobOutcome

    rig = Rig(min_np=2)
    ids = rig.start_elastic({"a": 2})
    rig.worker_heartbeat(ids[0], 237, True)
    for wid in ids:
        rig.worker_disconnected(wid)
        rig.worker_exited("a", wid, 0, 9, False)
    newcomers = list(rig.specs("a"))
    for wid in newcomers:  # the host was spared (killed, last host): replacements warm up
        rig.worker_connected(wid, 5)
        rig.worker_ready(wid, 0, "", True)
    assert rig.coordinator.generation.number == 2  # restarted, from the initial state
    assert any(
        "no --checkpoint-dir" in w and "237 step(s) committed so far are lost" in w
        for w in rig.coordinator.summary.warnings
    )
    rig.worker_done(rig.coordinator.generation.member_ids[0], 12, warning="the final checkpoint was not written")
    summary, *warnings = summary_events(JobOutcome(True, "done"), rig.coordinator.summary)
    assert summary.kind is Kind.JOB_SUMMARY
    assert (summary.fields["steps"], summary.fields["steps_lost"], summary.fields["success"]) == (12, 237, True)
    assert [w.kind for w in warnings] == [Kind.JOB_WARNING, Kind.JOB_WARNING]
    assert "no --checkpoint-dir" in warnings[0].fields["warning"]
    assert warnings[1].fields["warning"] == "worker a/3: the final checkpoint was not written"


def test_only_hosts_that_can_get_workers_are_wanted() -> None:
    rig = Rig(min_np=1, max_np=2, max_restarts=1)  # (a plain job: restarted once rather than failed)
    rig.set_hosts({f"h{i}": 1 for i in range(20)})
    assert rig.coordinator.hosts_wanted(rig.now) == ["h0", "h1"]
    rig.agent_connected("h0", 1)
    rig.agent_connected("h1", 2)
    ids = rig.coordinator.generation.member_ids
    rig.worker_disconnected(ids[1])
    rig.worker_exited("h1", ids[1], 1, 0, False)  # h1 blacklisted: the next host is wanted instead
    assert rig.coordinator.hosts_wanted(rig.now) == ["h0", "h2"]
    unlimited = Rig(min_np=1)
    unlimited.set_hosts({"a": 1, "b": 2})
    assert unlimited.coordinator.hosts_wanted(unlimited.now) == ["a", "b"]


def test_every_event_kind_renders_and_no_field_takes_a_reserved_key() -> None:
    """Each kind has a level and a console wording; fields never shadow a JSON line's own keys."""
    import string

    from ringmaster.common.events import RESERVED_FIELDS, SPECS, Kind

    assert set(SPECS) == set(Kind)
    for kind, spec in SPECS.items():
        names = {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(spec.text) if name}
        assert not names & RESERVED_FIELDS - {"generation"}, (kind, names & RESERVED_FIELDS)  # the event's own


def test_inputs_record_facts_and_settle_decides_on_them_in_order() -> None:
    """An input only records what it saw; the decisions (end the generation, blacklist the host)
    are made when the coordinator settles, in the order the facts came."""
    from ringmaster.common.events import Kind

    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    coordinator = rig.coordinator
    before = len(coordinator.summary.events)
    coordinator.worker_exited("a", ids[0], 1, 0, False, rig.now)
    coordinator.agent_disconnected("b", rig.now, "closed its connection")
    assert len(coordinator.summary.events) == before and coordinator.generation.over is None
    assert coordinator.drain() == []
    assert coordinator.settle(rig.now)
    kinds = [e.kind for e in list(coordinator.summary.events)[before:]]
    assert kinds.index(Kind.WORKER_EXITED) < kinds.index(Kind.HOST_LOST)
    assert Kind.GENERATION_OVER in kinds and kinds.count(Kind.HOST_BLACKLISTED) >= 1
    assert any(isinstance(e, StopAgent) and e.host == "b" for e in coordinator.drain())


def test_a_host_that_falls_silent_is_a_partition_and_one_that_closes_its_session_is_lost() -> None:
    rig = Rig(min_np=1, max_np=8)
    ids = rig.start_elastic({"a": 1, "b": 1})
    timeout = rig.coordinator.settings.heartbeat_timeout_s
    for step in range(int(timeout) + 2):  # a and its worker go on; b and its worker fall silent (cut off)
        rig.now = float(step + 1)
        rig.agent_heartbeat("a")
        rig.worker_heartbeat(ids[0], step, True)
        rig.tick()
    rig.worker_ready(ids[0], 1, "allreduce failed", True)
    formed = [e.fields for e in rig.coordinator.summary.events if e.kind is Kind.GENERATION_FORMED]
    assert formed[-1]["causes"] == ["partition"] and formed[-1]["size"] == 1


def test_resets_name_their_causes_and_recovery_ends_at_rank_zeros_first_commit() -> None:
    rig = Rig(min_np=1, max_np=8)
    ids = rig.start_elastic({"a": 1, "b": 1, "c": 1})

    def formed() -> list:
        return [e.fields for e in rig.coordinator.summary.events if e.kind is Kind.GENERATION_FORMED]

    def recovered() -> list:
        return [e.fields for e in rig.coordinator.summary.events if e.kind is Kind.JOB_RECOVERED]

    assert formed()[0]["causes"] == []  # the job's start is no reset
    rig.worker_heartbeat(ids[0], 5, True)
    rig.now = 10.0
    rig.agent_disconnected("c")  # the failure is seen now
    rig.now = 10.2
    rig.worker_ready(ids[0], 1, "allreduce failed", True)
    rig.worker_ready(ids[1], 1, "allreduce failed", True)
    assert formed()[-1]["causes"] == ["host_lost"]
    rig.now = 10.5
    rig.worker_heartbeat(ids[0], 5, True)  # synced to the last commit: not a step yet
    rig.worker_heartbeat(ids[1], 6, True)  # not rank 0
    assert recovered() == []
    rig.now = 10.8
    rig.worker_heartbeat(ids[0], 6, True)
    assert len(recovered()) == 1 and recovered()[0]["seconds"] == pytest.approx(0.8) and recovered()[0]["number"] == 2
    rig.now = 11.0
    rig.worker_heartbeat(ids[0], 7, True)
    assert len(recovered()) == 1  # once per failure
    rig.scale(1)
    rig.commit_at_update(ids[:2], 2)
    assert formed()[-1]["causes"] == ["scale"]
    rig.worker_heartbeat(ids[0], 8, True)
    assert len(recovered()) == 1  # a scale-down is no failure to recover from


def test_a_host_whose_agent_is_gone_shows_no_agent_pid() -> None:
    """A host removed from discovery is listed a while longer: not with its dead agent's pid."""
    rig = Rig(min_np=1)
    rig.start_elastic({"a": 1, "b": 1})
    rig.set_hosts({"a": 1})
    rig.agent_disconnected("b")
    hosts = {h.name: h for h in rig.coordinator.view(rig.now).hosts}
    assert hosts["b"].agent_pid is None and not hosts["b"].agent_connected
    assert hosts["a"].agent_pid == 100


def _passes(rig: Rig) -> list[float]:
    """Record each pass the coordinator makes over the job (its formation's reconcile)."""
    seen: list[float] = []
    reconcile = rig.coordinator.formation.reconcile

    def counted(now: float) -> None:
        seen.append(now)
        reconcile(now)

    rig.coordinator.formation.reconcile = counted  # type: ignore[method-assign]
    return seen


def test_inputs_that_change_nothing_but_themselves_need_no_pass_until_the_last() -> None:
    """A large job's start and host updates bring one input per member: a pass each (over every
    host and worker) made them quadratic. Members connecting, entering hvd.elastic.run and
    reaching their commit for an update are passed over, except the first that matters and the
    last, whose input decides. At a host update only one member reports the commit (every
    member is at it: the commit's allreduce agrees on the update); the others are placed, or
    retired where their host leaves, by the pass that forms the next generation, unasked."""
    rig = Rig(min_np=1)
    rig.set_hosts({"a": 2, "b": 2, "c": 2})
    for pid, host in enumerate("abc", start=100):
        rig.agent_connected(host, pid)
    ids = [a.worker_id for a in rig.coordinator.generation.members]
    passes = _passes(rig)
    for wid in ids:
        rig.worker_connected(wid, 1)
    assert len(passes) == 2  # the first to connect, and the last
    for wid in ids:
        rig.worker_heartbeat(wid, 0, True)
    assert len(passes) == 4  # the first inside hvd.elastic.run, and the last
    rig.set_hosts({"a": 2, "b": 2})  # c leaves: its members leave at their next commit
    updates = {w: rig.last(w, UpdateHosts) for w in ids}
    assert [w for w in ids if not updates[w].placed] == [ids[0]]  # one member reports the commit
    assert {u.generation for u in updates.values()} == {1}
    del passes[:]
    on_a_or_b, on_c = [w for w in ids if not w.startswith("c/")], [w for w in ids if w.startswith("c/")]
    rig.tick()
    assert len(passes) == 1 and not any(rig.kinds(w)[-1] == Retire for w in on_c)  # nobody reported yet
    del passes[:]
    rig.worker_ready(ids[0], 1, "", True)  # the report: every member is at the commit
    assert len(passes) == 1 and rig.coordinator.generation.number == 2
    assert [a.worker_id for a in rig.coordinator.generation.members] == on_a_or_b  # in their order
    assert all(rig.last(w, Assign).generation == 2 for w in on_a_or_b)
    assert all(rig.kinds(w)[-1] == Retire for w in on_c)  # retired by the pass that formed it
    del passes[:]
    rig.worker_ready(on_a_or_b[-1], 1, "", True)  # its place came after it asked: answered already
    with pytest.raises(Refused, match="is leaving the job"):  # (the worker leaves on this answer too)
        rig.worker_ready(on_c[0], 1, "", True)
    assert passes == [] and rig.coordinator.generation.number == 2
    for wid in on_c:
        rig.worker_disconnected(wid)
    assert passes == []  # a retired worker's session closing decides nothing: no pass
    rig.worker_disconnected(on_a_or_b[0])
    assert len(passes) == 1 and rig.coordinator.generation.over  # a member's: its failure, at once


def test_a_newcomer_whose_ready_or_place_came_before_its_session_costs_no_pass() -> None:
    """A large job's newcomers send their `Ready` through their agent, another way in than their
    session: under load a session opens after the `Ready`, even after its newcomer was placed.
    Its opening decides nothing (20 passes over a 2,048-host job's growth)."""
    rig = Rig(min_np=2, max_np=16)
    ids, newcomers = _newcomers_on_b(rig, 2)
    passes = _passes(rig)
    rig.worker_ready(newcomers[0], 0, "", True)  # before its session
    rig.worker_connected(newcomers[0], 2)
    assert passes == []
    rig.worker_ready(newcomers[1], 0, "", True)  # the last to warm up: the members are interrupted
    assert len(passes) == 1 and all(UpdateHosts in rig.kinds(w) for w in ids)
    rig.commit_at_update(ids, 1)
    assert rig.gen().number == 2 and newcomers[1] in rig.gen().member_set
    del passes[:]
    rig.worker_connected(newcomers[1], 3)  # placed before its session opened
    assert passes == [] and rig.last(newcomers[1], Assign).generation == 2


def test_newcomers_warming_up_together_cost_one_pass_when_the_last_is_warm() -> None:
    """Once the members were told newcomers are coming, each newcomer that connects, enters
    hvd.elastic.run or warms up while others still warm changes nothing (the host update waits
    for the last, or for --warmup-grace, which the clock sees): 512 newcomers on 64 hosts were
    three passes each over a 2,048-host job."""
    rig = Rig(min_np=2, max_np=16)
    ids, newcomers = _newcomers_on_b(rig, 3)
    assert all(AnnounceHosts in rig.kinds(w) for w in ids)  # the members were told at once
    passes = _passes(rig)
    for wid in newcomers:
        rig.worker_connected(wid, 2)
    for wid in newcomers:
        rig.worker_heartbeat(wid, 0, True)
    for wid in newcomers[:-1]:
        rig.worker_ready(wid, 0, "", True)
    rig.worker_ready(newcomers[0], 0, "", True)  # asked again (a session reopened saying it waits): nothing new
    rig.worker_connected(newcomers[0], 2, 0)
    assert passes == [] and not any(UpdateHosts in rig.kinds(w) for w in ids)
    rig.worker_ready(newcomers[-1], 0, "", True)  # the last: the members are interrupted
    assert len(passes) == 1 and all(UpdateHosts in rig.kinds(w) for w in ids)
    assert "new worker(s) ready" in rig.last(ids[0], UpdateHosts).reason


def test_only_the_first_report_of_a_generations_failure_costs_a_pass() -> None:
    """Every survivor of a lost host reports the failure its ring saw: the first ends the
    generation; the others (thousands in a large job, each once a pass over every worker) tell
    nothing new and set off no pass, and the next generation still forms with every survivor."""
    rig = Rig(min_np=2)
    ids = rig.start_elastic({"a": 2, "b": 2, "c": 2})
    passes = _passes(rig)
    rig.worker_ready(ids[0], 1, "allreduce failed: connection reset", True)
    first = len(passes)
    assert first >= 1 and rig.coordinator.generation.number == 2  # (the others rejoin at once)
    for wid in ids[1:]:
        rig.worker_ready(wid, 1, "allreduce failed: connection reset", True)
    assert len(passes) == first
    gen = rig.coordinator.generation
    assert gen.number == 2 and sorted(a.worker_id for a in gen.members) == sorted(ids)
    assert rig.coordinator.summary.resets == 1


def test_a_member_that_reconnects_during_a_host_update_is_told_it_again() -> None:
    """After a rendezvous fail-over the new leader holds the update the old one sent, and cannot
    know whether it reached each member: every member that connects is told it again."""
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.set_hosts({"a": 1})
    sent = rig.last(ids[0], UpdateHosts).sequence
    rig.worker_events.clear()
    rig.worker_connected(ids[0], 11)  # its session to the new leader
    assert rig.last(ids[0], UpdateHosts).sequence == sent
    rig.worker_ready(ids[0], 1, "", True)  # (told again, unplaced: it reports the commit)
    assert rig.gen().number == 2 and [a.worker_id for a in rig.gen().members] == [ids[0]]
    rig.worker_connected(ids[0], 11)  # a session opened with no update pending: none
    assert rig.kinds(ids[0])[-1] is not UpdateHosts


def test_a_gap_the_clock_planned_is_no_stall_and_one_beyond_it_is() -> None:
    """A large job's ticks are spaced by their cost (the server plans the next one): a tick that
    comes when planned says nothing of the rendezvous; one STALL_S later than planned is a stall."""
    from ringmaster.rendezvous.control.host_pool import STALL_S

    rig = Rig(min_np=1, heartbeat_timeout_s=60)
    rig.start_elastic({"a": 1, "b": 1})
    rig.tick()
    rig.coordinator.pool.tick_every_s = 3.0
    for _ in range(3):
        rig.now += 3.0 + STALL_S / 2
        rig.tick()
    stalls = [e for e in rig.coordinator.summary.events if e.kind is Kind.RENDEZVOUS_STALLED]
    assert stalls == []
    rig.now += 3.0 + STALL_S + 0.1
    rig.tick()
    [stall] = [e for e in rig.coordinator.summary.events if e.kind is Kind.RENDEZVOUS_STALLED]
    assert stall.fields["seconds"] > 3.0 + STALL_S


def _holders_die_while_newcomers_join(newcomers_report: int) -> Rig:
    """Host a's two workers (237 commits) take host b's two newcomers into generation 2, then
    host a dies; b's newcomers reported `newcomers_report` commits before that (0: their sync
    from a's rank 0 was cut off, so they hold only their initial state)."""
    rig = Rig(min_np=2, max_np=8)
    ids, newcomers = _newcomers_on_b(rig, 2)
    rig.worker_heartbeat(ids[0], 237, True)
    rig.worker_heartbeat(ids[1], 237, True)
    for wid in newcomers:
        rig.worker_connected(wid, 2)
        rig.worker_ready(wid, 0, "", True)
    for wid in ids:
        rig.worker_ready(wid, 1, "", True)
    assert rig.coordinator.generation.member_ids == ids + newcomers
    for wid in newcomers:
        rig.worker_heartbeat(wid, newcomers_report, True)
    rig.agent_disconnected("a")
    for wid in newcomers:
        rig.worker_ready(wid, 2, "allreduce: Connection closed by peer", True)
    assert rig.coordinator.generation.number == 3 and rig.coordinator.generation.member_ids == newcomers
    return rig


def test_members_whose_sync_was_cut_off_do_not_hold_the_lost_commit() -> None:
    rig = _holders_die_while_newcomers_join(newcomers_report=0)
    warnings = rig.coordinator.summary.warnings
    assert any("237 step(s) committed so far are lost" in w for w in warnings), warnings
    assert rig.coordinator.summary.steps == 0 and rig.coordinator.summary.steps_lost == 237


def test_members_that_reported_the_synced_commit_hold_it() -> None:
    rig = _holders_die_while_newcomers_join(newcomers_report=237)
    assert not any("lost" in w for w in rig.coordinator.summary.warnings), rig.coordinator.summary.warnings
    assert rig.coordinator.summary.steps == 237 and rig.coordinator.summary.steps_lost == 0


def test_a_host_whose_workers_alone_hold_the_commit_is_not_blacklisted_when_its_other_worker_dies() -> None:
    """Found by the chaos run in CI: a worker was SIGKILLed just after a ring formed with two
    newcomers, before they had received the commit; blacklisting its host (Horovod's rule) retired
    its host-mate, the one worker left holding the commit, and the job went on from the newcomers'
    initial state (91 committed steps lost). The host is spared instead, and its survivor leads."""
    rig = Rig(min_np=2, max_np=8)
    ids, newcomers = _newcomers_on_b(rig, 2)
    for wid in ids:
        rig.worker_heartbeat(wid, 91, True)  # the members hold the job's 91 commits
    for wid in newcomers:
        rig.worker_connected(wid, 2)
        rig.worker_ready(wid, 0, "", True)
    for wid in ids:
        rig.worker_ready(wid, 1, "", True)
    assert rig.coordinator.generation.number == 2  # the newcomers now receive the commit...
    for wid in newcomers:
        rig.worker_heartbeat(wid, 0, True)  # ...and do not hold it yet
    rig.worker_disconnected(ids[0])
    rig.worker_exited("a", ids[0], 0, 9, False)  # SIGKILLed mid-sync
    assert not rig.coordinator.pool.blacklist.is_blacklisted("a", rig.now)
    spared = [e for e in rig.coordinator.summary.events if e.kind is Kind.HOST_KEPT_FOR_COMMIT]
    assert spared and "hold the job's last commit" in spared[-1].message, spared
    assert not rig.coordinator.workers[ids[1]].stopping
    gen = rig.coordinator.generation
    assert gen.number == 3 and gen.members[0].worker_id == ids[1], gen.members
    assert [a.worker_id for a in gen.members] == [ids[1], *newcomers]
    assert not [e for e in rig.coordinator.summary.events if e.kind is Kind.COMMITS_LOST]


def test_a_host_is_blacklisted_as_before_once_others_hold_the_commit_too() -> None:
    rig = Rig(min_np=2, max_np=8)
    ids, newcomers = _newcomers_on_b(rig, 2)
    for wid in newcomers:
        rig.worker_connected(wid, 2)
        rig.worker_ready(wid, 0, "", True)
    for wid in ids:
        rig.worker_ready(wid, 1, "", True)
    for wid in ids + newcomers:
        rig.worker_heartbeat(wid, 91, True)  # the sync is done: everyone holds it
    rig.worker_disconnected(ids[0])
    rig.worker_exited("a", ids[0], 0, 9, False)
    assert rig.coordinator.pool.blacklist.is_blacklisted("a", rig.now)
    assert rig.coordinator.workers[ids[1]].stopping
    assert [a.worker_id for a in rig.coordinator.generation.members] == newcomers


def test_a_host_update_and_an_announcement_are_one_effect_for_every_member_they_go_to() -> None:
    rig = Rig(min_np=1, max_np=16, warmup_grace_s=60)
    ids = rig.start_elastic({"a": 2, "b": 2, "c": 2})
    rig.set_hosts({"a": 2, "b": 2, "c": 2, "d": 2})
    coordinator = rig.coordinator
    coordinator.agent_connected("d", 14, rig.now)  # its workers start: the members hear of them
    coordinator.settle(rig.now)
    announced = [e for e in coordinator.drain() if isinstance(e, AnnounceHosts)]
    assert [(e.worker_id, e.also) for e in announced] == [(ids[0], tuple(ids[1:]))]
    coordinator.set_hosts({"a": 2, "b": 2}, rig.now)  # host c leaves: its members leave at the next commit
    coordinator.settle(rig.now)
    updates = [e for e in coordinator.drain() if isinstance(e, UpdateHosts)]
    # the first member reports the commit (it asks); the others are placed unasked, in one effect
    assert [(e.worker_id, e.also, e.placed) for e in updates] == [(ids[0], (), False),
                                                                   (ids[1], tuple(ids[2:]), True)]


def test_the_workers_of_a_host_that_left_are_retired_by_one_effect_each_host() -> None:
    """A host's leavers are told alike (`Retire.also`): half of a 4,096 x 8 job leaving was
    16,384 effects, each sorted into its host's command one by one; now 2,048."""
    rig = Rig(min_np=2, max_np=16)
    ids = rig.start_elastic({"a": 2, "b": 2, "c": 3, "d": 3})
    raw: list = []
    drain = rig.coordinator.drain

    def noting():
        effects = drain()
        raw.extend(effects)
        return effects

    rig.coordinator.drain = noting  # type: ignore[method-assign]  # (the rig's own drain, noted)
    rig.set_hosts({"a": 2, "b": 2})
    rig.commit_at_update(ids, 1)
    assert rig.gen().number == 2
    retired = [e for e in raw if isinstance(e, Retire)]
    assert sorted((e.reason, (e.worker_id, *e.also)) for e in retired) == [
        ("host c left the job", tuple(i for i in ids if i.startswith("c/"))),
        ("host d left the job", tuple(i for i in ids if i.startswith("d/")))]
    assert all(rig.kinds(i)[-1] == Retire for i in ids if i[0] in "cd")  # (each hears it, one by one)
