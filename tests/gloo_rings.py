"""Real Gloo rings of threads in this process, for tests of what runs on a ring (Horovod's
operations, early data): each rank a thread with its own `Communicator`, an in-process store."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch.distributed as dist

from ringmaster.worker.train.collectives import Communicator
from ringmaster.worker.train.op_queue import Operation


def on_ranks(n: int, work: Callable[[Communicator], Any], timeout_s: float = 20,
             kind: Callable[[int], type[Communicator]] = lambda rank: Communicator) -> list[Any]:
    """`work(comm)` on each rank of a real Gloo ring of `n` threads; process sets get rings of
    their own under the same store (as the worker's context makes them). `kind(rank)`: the
    communicator class of that rank (a subclass that fails on purpose, for a fault test)."""
    store = dist.HashStore()
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore("ring/", store), rank, n, timedelta(seconds=timeout_s))

            def subring(ranks: tuple[int, ...]) -> tuple[Any, None]:
                prefix = f"ring/set-{'-'.join(map(str, ranks))}/"
                return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), ranks.index(rank), len(ranks),
                                             timedelta(seconds=timeout_s)), None

            comm = kind(rank)(pg, rank, n, generation=1, link=None, timeout_s=timeout_s, make_subring=subring)
            results[rank] = work(comm)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, errors
    return results


def run(comm: Communicator, operation: Operation) -> Any:
    return comm.ops.submit(operation).outcome()


def count_collectives(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names each collective the rings start (every one goes through `_issue_future`)."""
    started: list[str] = []
    original = Communicator._issue_future

    def counting(self: Communicator, issue: Callable[[], Any], what: str) -> Any:
        started.append(what)
        return original(self, issue, what)

    monkeypatch.setattr(Communicator, "_issue_future", counting)
    return started
