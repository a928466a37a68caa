"""Horovod's process sets: collectives among some of the workers, by their ranks.

A process set is its list of ranks. In an elastic job ranks are reassigned at every reset, so
a set means "the workers that hold these ranks in the current generation": its ring is built
by those workers the first time they use it in a generation, and rebuilt in the next one. A
set naming a rank the job no longer has (it shrank) cannot exist; using it raises `ValueError`
naming the set and the job's size, and it works again once the job is big enough. Sets are
registered per worker (`hvd.init(process_sets=[...])` or `hvd.add_process_set`, called the
same way by every worker, as Horovod requires): a worker that joins later registers them by
running the same script, so register them where every worker passes (before
`hvd.elastic.run`, or in a reset callback).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from ringmaster.torch.basics import context, size


class ProcessSet:
    """Some workers, by rank (sorted). `process_set_id` is set once the set is registered
    (`hvd.init(process_sets=...)` or `hvd.add_process_set`) and cleared when it is removed."""

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise ValueError("a ProcessSet is made from a list of ranks here (MPI communicators need Horovod built "
                             "with MPI, which this is not: hvd.mpi_built() is False)") from None
        if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ranks):
            raise ValueError(f"ProcessSet({ranks!r}): give ranks as non-negative whole numbers")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ProcessSet({ranks!r}): a rank appears twice")
        self.ranks = sorted(ranks)

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> int | None:
        """How many workers the set has (None when it is not registered)."""
        if self.process_set_id is None:
            return None
        return size() if self.process_set_id == 0 else len(self.ranks or [])

    def rank(self) -> int | None:
        """This worker's rank within the set (None when not registered); ValueError when it is not in it."""
        if self.process_set_id is None:
            return None
        ranks = self.current_ranks()
        mine = context().topology()[0]
        if mine not in ranks:
            raise ValueError(f"this worker (rank {mine}) is not part of {self}")
        return ranks.index(mine)

    def included(self) -> bool | None:
        """Is this worker in the set? (None when the set has no ranks yet)."""
        if self.process_set_id == 0:
            return True
        if self.ranks is None:
            return None
        return context().topology()[0] in self.ranks

    def current_ranks(self) -> list[int]:
        """The set's ranks in the current generation (the global set's change with the job's size)."""
        return list(range(size())) if self.process_set_id == 0 else list(self.ranks or [])

    def __str__(self) -> str:
        ranks = self.current_ranks() if self.process_set_id == 0 else self.ranks
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_lock = threading.Lock()
_registered: dict[int, ProcessSet] = {}
_next_id = 1


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a set (every worker calls this the same way, in the same order) and return it."""
    global _next_id
    context()  # (ValueError before hvd.init, as Horovod)
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    with _lock:
        # (A set of every current rank is not refused as the global set's twin, as Horovod would:
        # in an elastic job it means those ranks, whatever the size becomes.)
        if any(p.ranks == process_set.ranks for p in _registered.values()):
            raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
        if process_set.process_set_id is not None:
            raise ValueError(f"{process_set} is registered already")
        process_set.process_set_id = _next_id
        _registered[_next_id] = process_set
        _next_id += 1
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set; False for the global set or one not registered."""
    context()
    with _lock:
        if process_set.process_set_id in (None, 0) or _registered.get(process_set.process_set_id) is not process_set:
            return False
        del _registered[process_set.process_set_id]
        process_set._invalidate()
    return True


def forget_all() -> None:
    """`hvd.shutdown()`: every registered set is gone (Horovod's rule); ids start again at 1."""
    global _next_id
    with _lock:
        for process_set in _registered.values():
            process_set._invalidate()
        _registered.clear()
        _next_id = 1


def ring_of(process_set: ProcessSet | None) -> Any:
    """The communicator of `process_set` in the current generation (this worker must be in it)."""
    comm = context().communicator()
    if process_set is None or process_set is global_process_set or process_set.process_set_id == 0:
        return comm
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set= takes a ProcessSet (hvd.add_process_set's), got {type(process_set).__name__}")
    if process_set.process_set_id is None or _registered.get(process_set.process_set_id) is not process_set:
        raise ValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or "
                         "hvd.add_process_set first (and again after hvd.shutdown)")
    ranks = tuple(process_set.ranks or ())
    if ranks and ranks[-1] >= comm.size:
        raise ValueError(f"{process_set} names rank {ranks[-1]} but the job has {comm.size} workers now: a process "
                         "set holds the workers with its ranks in the current generation, and this one cannot exist "
                         "until the job grows back (or remove it and add one that fits)")
    if comm.rank not in ranks:
        raise ValueError(f"this worker (rank {comm.rank}) is not part of {process_set}: only its members may use it")
    return comm.subgroup(ranks)


def root_in(process_set: ProcessSet | None, root_rank: int) -> int:
    """A broadcast's root (a rank of the job, as in Horovod) as a rank of the set's ring."""
    if not isinstance(root_rank, int) or isinstance(root_rank, bool) or root_rank < 0:
        raise ValueError(f"root_rank {root_rank!r}: give the rank of a worker")
    if process_set is None or process_set.process_set_id == 0:
        if root_rank >= size():
            raise ValueError(f"root_rank {root_rank}: the job has {size()} workers now (ranks 0 to {size() - 1})")
        return root_rank
    ranks = process_set.ranks or []
    if root_rank not in ranks:
        raise ValueError(f"root_rank {root_rank} is not in {process_set}")
    return ranks.index(root_rank)
