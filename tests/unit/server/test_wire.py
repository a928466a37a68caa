"""What the coordinator's effects become on the wire."""

from __future__ import annotations

from ringmaster.rendezvous.control.assignment import RankAssignment
from ringmaster.rendezvous.control.effects import Assign, EndGeneration, UpdateHosts, WorkerEffect
from ringmaster.rendezvous.server.wire import worker_events


def _assign(worker_id: str, generation: int) -> Assign:
    return Assign(RankAssignment(worker_id, "h", 0, 2, 0, 2, 0, 1), generation, "127.0.0.1", 1, "p/", 0)


def test_a_survivors_end_and_next_place_go_in_one_message_others_unchanged() -> None:
    effects: list[WorkerEffect] = [EndGeneration("h/1", 3, "h/2 failed"), EndGeneration("h/2", 3, "h/2 failed"),
               _assign("h/1", 4), UpdateHosts("h/3", 7, "grow", False), _assign("h/4", 4)]
    sent = worker_events(effects)
    assert [(w, m.WhichOneof("event")) for w, m in sent] == [
        ("h/2", "generation_over"), ("h/1", "assignment"), ("h/3", "hosts_updated"), ("h/4", "assignment")]
    survivor = sent[1][1].assignment
    assert (survivor.generation, survivor.ends_generation, survivor.ends_reason) == (4, 3, "h/2 failed")
    assert sent[3][1].assignment.ends_generation == 0  # a newcomer ended nothing


def test_an_end_is_never_lost_nor_put_in_an_older_or_the_same_generation() -> None:
    sent = worker_events([_assign("h/1", 4), EndGeneration("h/1", 3, "late"), EndGeneration("h/5", 4, "x"),
                          _assign("h/5", 4)])
    kinds = [(w, m.WhichOneof("event")) for w, m in sent]
    assert ("h/1", "generation_over") in kinds and ("h/5", "generation_over") in kinds
    assert all(m.assignment.ends_generation == 0 for _w, m in sent if m.WhichOneof("event") == "assignment")


def test_what_says_the_same_to_many_workers_is_built_once_and_what_differs_is_not_shared() -> None:
    from ringmaster.rendezvous.control.effects import EndJob, Retire

    effects: list[WorkerEffect] = [UpdateHosts(f"h/{i}", 7, "grow", False) for i in range(4)]
    effects += [UpdateHosts("h/9", 7, "grow", True), UpdateHosts("h/8", 8, "grow", False),
                Retire("h/1", "smaller"), Retire("h/2", "smaller"), EndJob("h/3", True,
                                                                           "done"), EndJob("h/4", False, "done")]
    sent = worker_events(effects)
    assert [w for w, _m in sent] == [e.worker_id for e in effects]
    messages = [m for _w, m in sent]
    assert len({id(m) for m in messages[:4]}) == 1  # one message for the same update to four members
    assert messages[4] is not messages[0] and messages[4].hosts_updated.checkpoint
    assert messages[5] is not messages[0] and messages[5].hosts_updated.sequence == 8
    assert messages[6] is messages[7] and messages[6].retire.reason == "smaller"
    assert messages[8] is not messages[9] and messages[8].job_ended.success and not messages[9].job_ended.success


def test_a_message_written_in_place_is_the_message_and_only_the_jobs_end_stays_off_agents() -> None:
    """A host's carried messages are written inside its agent's command (event_relay.py): the
    same bytes as the message its worker's stream would carry."""
    from ringmaster.proto import ringmaster_pb2 as pb
    from ringmaster.rendezvous.control.effects import EndJob, Retire
    from ringmaster.rendezvous.server.wire import carriable, fill, plan, worker_event

    effects: list[WorkerEffect] = [EndGeneration("h/1", 3, "h/2 failed"), _assign("h/1", 4),
                                   UpdateHosts("h/3", 7, "grow", True), EndGeneration("h/4", 3, "x")]
    command = pb.AgentCommand()
    for worker_id, effect, ends in plan(effects):
        fill(command.events.add(worker_id=worker_id).event, effect, ends)
    assert [(e.worker_id, e.event.SerializeToString()) for e in command.events] == [
        ("h/1", worker_event(_assign("h/1", 4), EndGeneration("h/1", 3, "h/2 failed")).SerializeToString()),
        ("h/3", worker_event(UpdateHosts("h/3", 7, "grow", True)).SerializeToString()),
        ("h/4", worker_event(EndGeneration("h/4", 3, "x")).SerializeToString())]
    assert command.events[0].event.assignment.ends_reason == "h/2 failed"
    assert all(carriable(e) for e in effects)
    assert carriable(Retire("h/1", "smaller"))  # (the worker leaves, and closes its session itself)
    assert not carriable(EndJob("h/1", True, "done"))  # (ends its stream)


def test_an_announcement_of_newcomers_is_its_own_message_shared_by_the_members() -> None:
    from ringmaster.rendezvous.control.effects import AnnounceHosts

    sent = worker_events([AnnounceHosts("h/1", 5, "new worker(s) warming up: g/3"),
                          AnnounceHosts("h/2", 5, "new worker(s) warming up: g/3")])
    (_w1, first), (_w2, second) = sent
    assert first is second and first.WhichOneof("event") == "hosts_announced"  # not `hosts_updated`: no interrupt
    assert (first.hosts_announced.sequence, first.hosts_announced.reason) == (5, "new worker(s) warming up: g/3")
