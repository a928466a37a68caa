"""A collective's wait on a real Gloo ring of two threads with a worker's link (no rendezvous:
the link is handed its events as its session's thread would): Gloo's own short wait first, then
the wait the generation-over signal wakes. The first is only safe while c10d's timed-out wait
leaves the collective going, so that is checked here too (a torch upgrade could change it)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.worker.train.collectives import SHORT_WAIT, Communicator
from ringmaster.worker.train.errors import HorovodInternalError
from ringmaster.worker.train.link import RendezvousLink

GENERATION = 3


def on_two_ranks(work: Callable[[int, Any, RendezvousLink], Any], timeout_s: float = 30) -> list[Any]:
    """`work(rank, pg, link)` on each rank of a real Gloo ring of two threads; its results."""
    store = dist.HashStore()
    results: list[Any] = [None, None]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore("ring/", store), rank, 2, timedelta(seconds=timeout_s))
            link = RendezvousLink("127.0.0.1:1", f"h/{rank}", "h")
            link._on_event(pb.WorkerEvent(assignment=pb.Assignment(generation=GENERATION, rank=rank, size=2)))
            results[rank] = work(rank, pg, link)
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 10)
    assert not any(t.is_alive() for t in threads), "a rank never finished"
    if errors:
        raise errors[0]
    return results


def test_a_timed_out_gloo_wait_leaves_the_collective_going() -> None:
    def work(rank: int, pg: Any, link: RendezvousLink) -> tuple[bool, list[float]]:
        out = torch.empty(4)
        if rank == 1:
            time.sleep(0.2)  # (the peer late on purpose: what is under test is the early rank's wait)
        pending = pg._allgather_base(out, torch.full((2,), float(rank)))
        timed_out = False
        if rank == 0:
            with pytest.raises(RuntimeError, match="timed out"):
                pending.wait(SHORT_WAIT)
            timed_out = True
        pending.wait()
        return timed_out, out.tolist()

    (timed_out, gathered), (_, theirs) = on_two_ranks(work)
    assert timed_out and gathered == theirs == [0.0, 0.0, 1.0, 1.0]


def test_a_collective_longer_than_the_short_wait_completes_through_the_usual_wait() -> None:
    def work(rank: int, pg: Any, link: RendezvousLink) -> list[float]:
        comm = Communicator(pg, rank, 2, GENERATION, link, timeout_s=30)
        results = []
        for late_s in (0.0, 0.05, 0.0):  # quick, longer than the short wait, quick again
            if rank == 1:
                time.sleep(late_s)
            tensor = torch.full((3,), float(rank + 1))
            comm.allreduce_(tensor)
            results.extend(tensor.tolist())
        return results

    assert on_two_ranks(work) == [[3.0] * 9] * 2


#: Each way a rank waits on a peer: a Gloo collective (its short wait, then the usual one), and
#: an alltoall's point-to-point transfers (`exchange`), waited for on a thread of their own.
WAITS: dict[str, Callable[[Communicator], Any]] = {
    "allreduce": lambda comm: comm.allreduce_(torch.ones(3)),
    "alltoall": lambda comm: comm.exchange_async([None, torch.ones(3)], [None, torch.empty(3)], "alltoall").wait(),
}


@pytest.mark.parametrize("what", WAITS)
def test_a_wait_whose_peer_never_comes_ends_when_the_generation_is_over(what: str) -> None:
    """The peer is alive and silent (a stopped process): only the rendezvous' word ends the
    wait, not the 30 s timeout."""

    def work(rank: int, pg: Any, link: RendezvousLink) -> tuple[str, float]:
        if rank == 1:
            time.sleep(1.0)  # never issues the collective nor posts its transfers
            return "", 0.0
        comm = Communicator(pg, rank, 2, GENERATION, link, timeout_s=30)
        started = time.monotonic()
        threading.Timer(0.3, lambda: link._on_event(pb.WorkerEvent(
            generation_over=pb.GenerationOver(generation=GENERATION, reason="h/1 stopped", rejoin=True)))).start()
        with pytest.raises(HorovodInternalError) as caught:
            WAITS[what](comm)
        return str(caught.value), time.monotonic() - started

    (message, took_s), _ = on_two_ranks(work)
    assert "generation 3 is over (h/1 stopped)" in message and what in message
    assert took_s < 10, f"the wait ended {took_s:.1f} s after it began, not at the rendezvous' word (0.3 s)"


def test_an_exchange_whose_peer_is_gone_fails_at_once() -> None:
    """A peer whose ring goes away while the exchange waits for it (its thread ends and drops its
    only reference to its ring: the connections close, as a killed process' do) fails the
    exchange's transfers at once, long before the collective timeout."""

    def work(rank: int, pg: Any, link: RendezvousLink) -> tuple[str, float]:
        if rank == 1:
            time.sleep(0.3)  # then this thread ends, and with it this rank's ring
            return "", 0.0
        comm = Communicator(pg, rank, 2, GENERATION, link, timeout_s=30)
        started = time.monotonic()
        with pytest.raises(HorovodInternalError) as caught:
            comm.exchange_async([None, torch.ones(1 << 20)], [None, torch.empty(1 << 20)], "allgather").wait()
        return str(caught.value), time.monotonic() - started

    (message, took_s), _ = on_two_ranks(work)
    assert "allgather failed in generation 3" in message and "Connection closed by peer" in message
    assert took_s < 10, f"a gone peer failed the exchange after {took_s:.1f} s, not at once"
