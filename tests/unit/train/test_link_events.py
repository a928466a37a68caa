"""What a worker's link makes of the messages of its session (no connection: the events are
handed to it as its session's thread would)."""

from __future__ import annotations

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
