"""A state sync whose root stops halfway leaves every receiver its own last commit, whole.

Real Gloo groups of two ranks (threads of this process, loopback). The root sends its first
flat buffer and then never sends again, as a host killed in the middle of a sync does; the
receiver's wait for the second buffer times out for real. The root's skeleton reaches the
receiver through a shared variable instead of an object broadcast (that broadcast is whole or
absent, and is not what this test is about). Found in a chaos run: a newcomer kept the dead
root's objects over half-received buffers (uninitialised memory) as its commit, rolled back to
it, and trained a model of 1e37s and NaNs.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ringmaster.checkpoint.memory import HostSnapshot
from ringmaster.worker.train.collectives import Communicator
from ringmaster.worker.train.state_sync import sync_snapshot


class StopsAfterFirstBuffer(Communicator):
    """The root's communicator: its second buffer is never sent (it 'dies' there)."""

    sent = 0

    def broadcast_(self, tensor: torch.Tensor, root_rank: int) -> torch.Tensor:
        self.sent += 1
        if self.sent > 1:
            raise SystemExit("the root stops here")
        return super().broadcast_(tensor, root_rank)


def _pair(work: Any) -> list[Any]:
    """`work(rank, comm, share)` on ranks 0 and 1 of a real Gloo group, each on a thread."""
    store = dist.HashStore()
    share: dict[str, Any] = {"ready": threading.Event()}
    results: list[Any] = [None, None]

    def run(rank: int) -> None:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("sync", store), rank, 2, timedelta(seconds=2))
        kind = StopsAfterFirstBuffer if rank == 0 else Communicator
        comm = kind(pg, rank, 2, generation=1, link=None, timeout_s=2)
        try:
            results[rank] = work(rank, comm, share)
        except BaseException as exc:  # the test reads what each rank ended with
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return results


ROOT_STATE: dict[str, Any] = {"model": {"w": torch.full((1000,), 7.0)}, "steps": torch.arange(5), "epoch": 4}


def _sync(rank: int, comm: Communicator, share: dict[str, Any],
          mine: dict[str, Any]) -> tuple[BaseException | None, Any]:
    """Rank 0 holds ROOT_STATE's commit, rank 1 `mine`; sync, and say how it ended and what is held."""
    snapshot = HostSnapshot()
    snapshot.capture(ROOT_STATE if rank == 0 else mine)

    def broadcast_object(obj: Any, root: int) -> Any:
        if rank == root:
            share["skeleton"] = obj
            share["ready"].set()
            return obj
        assert share["ready"].wait(10)
        return share["skeleton"]

    try:
        sync_snapshot(snapshot, comm, broadcast_object)
    except BaseException as exc:  # what the rank ended with is the result
        return exc, snapshot.export()
    return None, snapshot.export()


@pytest.mark.parametrize("newcomer", [True, False], ids=["newcomer-other-layout", "same-layout-other-bytes"])
def test_a_receiver_keeps_its_own_commit_when_the_root_stops_halfway(newcomer: bool) -> None:
    mine: dict[str, Any] = (
        {"model": {"w": torch.zeros(10)}, "steps": torch.zeros(3, dtype=torch.int64), "epoch": 0} if newcomer
        else {"model": {"w": torch.full((1000,), 1.0)}, "steps": torch.ones(5, dtype=torch.int64), "epoch": 0})
    (root_error, _), (error, kept) = _pair(lambda rank, comm, share: _sync(rank, comm, share, mine))
    assert isinstance(root_error, SystemExit)
    assert error is not None, "the receiver's wait for the second buffer must fail"
    assert kept["epoch"] == 0, "the dead root's objects were taken without its bytes"
    assert torch.equal(kept["model"]["w"], mine["model"]["w"]) and torch.equal(kept["steps"], mine["steps"])


def test_a_sync_that_completes_gives_the_receiver_the_roots_commit() -> None:
    """The same pair with nothing stopped: the staged buffers become the receiver's commit."""
    mine: dict[str, Any] = {"model": {"w": torch.zeros(10)}, "epoch": 0}

    def work(rank: int, comm: Communicator, share: dict[str, Any]) -> Any:
        comm.__class__ = Communicator  # the root sends everything
        return _sync(rank, comm, share, mine)

    _, (error, got) = _pair(work)
    assert error is None
    assert got["epoch"] == 4 and torch.equal(got["model"]["w"], ROOT_STATE["model"]["w"])
    assert torch.equal(got["steps"], ROOT_STATE["steps"])
