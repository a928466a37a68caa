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
