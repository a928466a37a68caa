"""What a worker's link makes of the messages of its session (no connection: the events are
handed to it as its session's thread would)."""

from __future__ import annotations

import time

import pytest
from harness import wait_for

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.worker.train.link import RendezvousLink


def test_an_assignment_that_ends_the_workers_generation_ends_it_and_places_it() -> None:
    link = RendezvousLink("127.0.0.1:1", "h/1", "h")
    link._on_event(pb.WorkerEvent(assignment=pb.Assignment(generation=3, rank=0, size=2)))
    assert link.generation_over(3) is None
    link._on_event(pb.WorkerEvent(assignment=pb.Assignment(generation=4, rank=0, size=1, ends_generation=3,
                                                            ends_reason="h/2 failed")))
    assert link.generation_over(3) == "h/2 failed"  # its collectives in generation 3 abort
    assert link.wait_assignment(3, timeout_s=0).generation == 4  # and its next place is already there
    assert link.generation_over(4) is None


def test_a_late_message_cannot_take_back_a_newer_fact() -> None:
    """A large job's messages come through the agent as well as on the session (event_relay.py),
    not ordered with each other: what the link keeps is the newest of each."""
    link = RendezvousLink("127.0.0.1:1", "h/1", "h")
    link._on_event(pb.WorkerEvent(assignment=pb.Assignment(generation=5, rank=1, size=4)))
    link._on_event(pb.WorkerEvent(hosts_updated=pb.HostsUpdated(sequence=7)))
    link._on_event(pb.WorkerEvent(assignment=pb.Assignment(generation=4, rank=0, size=8, ends_generation=3)))
    link._on_event(pb.WorkerEvent(hosts_updated=pb.HostsUpdated(sequence=6)))
    assert (link.wait_assignment(0, timeout_s=0).generation, link.wait_assignment(0, timeout_s=0).rank) == (5, 1)
    assert link.hosts_sequence() == 7
    assert link.generation_over(3) == "generation over"  # (an end is a fact whenever it comes)


class _Calls:
    """Stands in for the link's stub (no rendezvous runs here): records the `Ready` calls made."""

    def __init__(self) -> None:
        self.readies: list[pb.ReadyRequest] = []

    def Ready(self, request: pb.ReadyRequest, timeout: float) -> pb.Ack:  # noqa: N802 (gRPC's name)
        self.readies.append(request)
        return pb.Ack(ok=True)


def _linked() -> tuple[RendezvousLink, _Calls]:
    link = RendezvousLink("127.0.0.1:1", "h/1", "h")
    calls = _Calls()
    link._stub = calls  # type: ignore[assignment]
    return link, calls


def test_a_survivor_placed_unasked_asks_for_nothing() -> None:
    """A large job's survivors would each send a `Ready` the rendezvous does not need (32,768
    calls at 4,096 x 8): told its generation is over and that it rejoins, a worker only waits."""
    import threading

    link, calls = _linked()
    link._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=3, reason="h/2 failed", rejoin=True)))
    link.ready(3, "allreduce: connection closed by peer")
    assert calls.readies == []
    waiting = threading.Thread(target=link.ready, args=(4, "allreduce: connection closed by peer"))
    waiting.start()  # its ring failed before the word came: it waits for the word ...
    link._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=4, reason="h/3 failed", rejoin=True)))
    waiting.join(10)
    assert not waiting.is_alive() and calls.readies == []  # ... which came: no call


def test_a_failure_the_rendezvous_did_not_see_or_a_worker_it_does_not_place_is_reported(monkeypatch) -> None:
    from ringmaster.worker.train import link as link_module

    monkeypatch.setattr(link_module, "REJOIN_NOTICE_S", 0.05)
    link, calls = _linked()
    link.ready(3, "allreduce: connection closed by peer")  # no word comes: it says what it saw
    link._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=4, reason="h/3 failed")))
    link.ready(4, "allreduce: timed out")  # over, but not placed unasked (not yet inside hvd.elastic.run)
    link.ready(4, "")  # warm, or after a host update: asks at once
    assert [(r.after_generation, r.failure) for r in calls.readies] == [
        (3, "allreduce: connection closed by peer"), (4, "allreduce: timed out"), (4, "")]


def test_a_large_jobs_worker_waits_longer_for_the_word(monkeypatch, tmp_path) -> None:
    """Its agent carries its beats (a large job): its rendezvous takes longer to decide on a lost
    host, so its survivors wait longer before asking (REJOIN_NOTICE_LARGE_S)."""
    import threading

    from ringmaster.common.beat_relay import RELAY_MARK, BeatSender
    from ringmaster.worker.train import link as link_module

    monkeypatch.setattr(link_module, "REJOIN_NOTICE_S", 0.0)
    monkeypatch.setattr(link_module, "REJOIN_NOTICE_LARGE_S", 30.0)
    link, calls = _linked()
    (tmp_path / RELAY_MARK).touch()  # (the agent's mark: relay)
    link._relay = BeatSender(str(tmp_path))
    waiting = threading.Thread(target=link.ready, args=(3, "allreduce: connection closed by peer"))
    waiting.start()
    wait_for(lambda: link._waiting is not None, 10, "the worker to wait")  # (set under the lock its wait releases)
    link._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=3, reason="host h9 lost", rejoin=True)))
    waiting.join(10)
    assert not waiting.is_alive() and calls.readies == []


def test_an_announcement_is_no_update_until_a_script_claims_it_and_then_its_ready_says_so() -> None:
    """Newcomers announced (`HostsAnnounced`) interrupt nobody; a Horovod script that polls
    `state._host_messages` claims the announcement (its next commit resets), and the Ready that
    follows names it, once, so that the next ring waits for the newcomers."""
    link, calls = _linked()
    link._on_event(pb.WorkerEvent(hosts_announced=pb.HostsAnnounced(sequence=4, reason="b/3 warming up")))
    assert (link.announced_sequence(), link.hosts_sequence(), link.claimed_sequence()) == (4, 0, 0)
    assert link.claim_announced(baseline=4) == 0  # not newer than the generation's baseline
    assert link.claimed_sequence() == 0
    link._on_event(pb.WorkerEvent(hosts_announced=pb.HostsAnnounced(sequence=2)))  # a late, older one
    assert link.claim_announced(baseline=3) == 4 and link.claimed_sequence() == 4
    link.awaits_hosts(4)
    link.ready(1, "")
    link.ready(2, "")
    assert [(r.after_generation, r.awaits_hosts) for r in calls.readies] == [(1, 4), (2, 0)]


def test_a_worker_placed_unasked_then_left_over_asks_once_out_of_its_generation() -> None:
    """A replica group's member whose partner died is promised its place, then left over (no
    whole group to join): the rendezvous takes the promise back. It asks once it is out of the
    ended generation's collectives, whether the word came before it got there or while it was
    already waiting; and the promise, taken back, stays taken back whatever order they came in."""
    import threading

    link, calls = _linked()
    link._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=3, reason="h/2 failed", rejoin=True)))
    link.ready(3, "allgather: connection closed by peer")
    assert calls.readies == []  # promised: it waits without asking ...
    waiting = threading.Thread(target=link.wait_assignment, args=(3,), daemon=True)
    waiting.start()
    link._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=3, reason="left over")))
    wait_for(lambda: len(calls.readies) == 1, 10, "the left-over worker's Ready")
    assert (calls.readies[0].after_generation, calls.readies[0].failure) == (3, "allgather: connection closed by peer")
    link._on_event(pb.WorkerEvent(assignment=pb.Assignment(generation=5, rank=2, size=4)))
    waiting.join(10)
    assert not waiting.is_alive() and len(calls.readies) == 1  # ... then it is placed, having asked once

    late, late_calls = _linked()  # the word to ask came before it left the collective, the promise after
    late._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=3, reason="left over")))
    late._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=3, reason="h/2 failed", rejoin=True)))
    late.ready(3, "allgather: timed out")
    assert [r.after_generation for r in late_calls.readies] == [3]


def test_a_member_placed_unasked_at_a_host_update_waits_for_its_word_and_asks_only_without_it(monkeypatch) -> None:
    """At a host update one member reports the commit; the others (`HostsUpdated.placed`) are
    told their next place, or to leave, without asking: 32,768 `Ready`s were most of a large
    job's growth. A word that does not come within the notice is asked for after all."""
    import threading

    from ringmaster.worker.train import link as link_module
    from ringmaster.worker.train.link import Retired

    monkeypatch.setattr(link_module, "REJOIN_NOTICE_S", 0.05)
    link, calls = _linked()
    link._on_event(pb.WorkerEvent(assignment=pb.Assignment(generation=3, rank=1, size=2)))
    link._on_event(pb.WorkerEvent(hosts_updated=pb.HostsUpdated(sequence=5, placed=True, generation=3)))
    link.ready(3, "")  # no word within the notice: it asks
    assert [(r.after_generation, r.failure) for r in calls.readies] == [(3, "")]
    monkeypatch.setattr(link_module, "REJOIN_NOTICE_S", 30.0)
    waiting = threading.Thread(target=link.ready, args=(3, ""))
    waiting.start()
    link._on_event(pb.WorkerEvent(assignment=pb.Assignment(generation=4, rank=1, size=3, hosts_sequence=5)))
    waiting.join(10)
    assert not waiting.is_alive() and len(calls.readies) == 1  # its place came: no call
    assert link.wait_assignment(3, timeout_s=0).generation == 4
    link._on_event(pb.WorkerEvent(hosts_updated=pb.HostsUpdated(sequence=6, placed=True, generation=4)))
    leaving = threading.Thread(target=link.ready, args=(4, ""))
    leaving.start()
    link._on_event(pb.WorkerEvent(retire=pb.Retire(reason="host h left the job")))
    leaving.join(10)
    assert not leaving.is_alive() and len(calls.readies) == 1  # told to leave instead: no call ...
    with pytest.raises(Retired, match="left the job"):
        link.wait_assignment(4, timeout_s=0)  # ... and it leaves
    reporter, its_calls = _linked()  # the member that reports the commit asks at once, notice or not
    reporter._on_event(pb.WorkerEvent(hosts_updated=pb.HostsUpdated(sequence=5, generation=3)))
    started = time.monotonic()
    reporter.ready(3, "")
    assert [r.after_generation for r in its_calls.readies] == [3] and time.monotonic() - started < 10
