"""When the last of a generation's assignments left the rendezvous (`assignments_out.py`): the
figure the metrics and `/status` give for the rendezvous' own part of a change."""

from __future__ import annotations

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.server.assignments_out import AssignmentsOut


def _assignments(n: int, generation: int = 3) -> list[pb.WorkerEvent]:
    return [pb.WorkerEvent(assignment=pb.Assignment(generation=generation, rank=r, size=n)) for r in range(n)]


def test_only_the_last_written_assignment_reports_with_the_time_since_the_change_began() -> None:
    out = AssignmentsOut()
    first, second = _assignments(2)
    out.queued(3, 10.0, [first])
    out.queued(3, 99.0, [second])  # (the same generation's later messages: its change began at 10)
    assert out.handed_over(pb.WorkerEvent(), 11.0) is None  # (a message it does not watch)
    assert out.handed_over(second, 11.5) is None
    assert out.watching
    assert out.handed_over(first, 12.25) == (3, 2.25)
    assert not out.watching and out.handed_over(first, 13.0) is None  # (reported once)
    again, = _assignments(1)
    out.queued(3, 10.0, [again])  # (said again to a worker that reconnected: not watched)
    assert not out.watching and out.handed_over(again, 20.0) is None


def test_moved_messages_are_watched_where_they_went_and_dropped_ones_are_not_waited_for() -> None:
    out = AssignmentsOut()
    carried = pb.AgentCommand(events=[pb.HostedEvent(worker_id=f"hA/{r}", event=e)
                                      for r, e in enumerate(_assignments(2))])
    streamed, = _assignments(1)
    out.queued(3, 0.0, [carried, streamed])
    # (Messages are told apart by identity: the moved ones are the objects queued, kept here.)
    moved = [hosted.event for hosted in carried.events]
    out.moved(carried, moved)  # (its agent's session ended)
    out.dropped([moved[1]])  # (that worker's session ended too)
    assert out.handed_over(carried, 1.0) is None
    assert out.handed_over(streamed, 1.0) is None
    assert out.handed_over(moved[0], 2.0) == (3, 2.0)


def test_a_newer_generation_replaces_one_still_going_out_and_an_older_one_is_ignored() -> None:
    out = AssignmentsOut()
    old, = _assignments(1, generation=3)
    new, = _assignments(1, generation=4)
    out.queued(3, 0.0, [old])
    out.queued(4, 5.0, [new])
    out.queued(3, 0.0, [pb.WorkerEvent()])  # (late and older: not watched)
    assert out.handed_over(old, 6.0) is None
    assert out.handed_over(new, 6.5) == (4, 1.5)
