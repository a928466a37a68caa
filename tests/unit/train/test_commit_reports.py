"""Which commit counts a worker reports at once rather than with its next timed heartbeat (a real
link with no rendezvous behind it: what is checked is whether the heartbeat thread was woken)."""

from __future__ import annotations

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.worker.train.context import WorkerContext
from ringmaster.worker.train.link import RendezvousLink


def _context() -> tuple[WorkerContext, RendezvousLink]:
    context = WorkerContext(environ={})
    link = RendezvousLink("127.0.0.1:1", "h/1", "h")
    context.link = link
    context.assignment = pb.Assignment(generation=2, rank=1, size=2)
    return context, link


def _woken(link: RendezvousLink) -> bool:
    woken = link._beat_now.is_set()
    link._beat_now.clear()
    return woken


def test_a_commit_received_by_a_sync_is_reported_at_once() -> None:
    """From then on the worker holds the job's last commit: the rendezvous must know it before
    the workers that held it before can die (it would count the commit lost)."""
    context, link = _context()
    context.note_commit(237, received=True)
    assert _woken(link) and link.commits == 237


def test_the_first_new_commit_of_a_generation_is_reported_at_once_and_the_rest_with_heartbeats() -> None:
    context, link = _context()
    context.note_commit(238, new=True)
    assert _woken(link)
    context.note_commit(239, new=True)
    assert not _woken(link)
    context.note_commit(238)  # a rollback: not news
    assert not _woken(link) and link.commits == 238
    context.assignment = pb.Assignment(generation=3, rank=0, size=1)
    context.note_commit(239, new=True)
    assert _woken(link)
