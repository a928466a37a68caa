"""`hvd.elastic.replica_group()`: this worker's replica group in the current generation.

A job started with `--group-size K` trains in groups of K consecutive ranks (group g holds
ranks gK .. gK+K-1): the model is sharded inside a group and replicated across groups, and the
rendezvous only ever forms generations of whole groups (a worker lost takes its group out). The
numbers change with each generation, so read them again after every reset (in a reset callback
or at the top of the training function), as `hvd.rank()`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ringmaster.proto import environment as env_names
from ringmaster.settings import MAX_GROUP_SIZE
from ringmaster.torch.basics import rank, size


@dataclass(frozen=True)
class ReplicaGroup:
    """This worker's group: `index` of `count` groups, `rank` of `size` workers inside it, and
    `ranks`, the ring ranks of its members."""

    index: int
    count: int
    rank: int
    size: int

    @property
    def ranks(self) -> list[int]:
        return list(range(self.index * self.size, (self.index + 1) * self.size))

    def peers(self) -> list[int]:
        """The ring ranks holding the same part of the model as this worker, one in each group
        (this worker's included): the replicas its shards are averaged with."""
        return [group * self.size + self.rank for group in range(self.count)]


def group_size(environ: dict[str, str] | None = None) -> int:
    """The job's `--group-size` (1 when it has none), from the environment the rendezvous gave
    this worker. ValueError naming the variable when it is not a whole number in range."""
    text = (os.environ if environ is None else environ).get(env_names.GROUP_SIZE, "1")
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_GROUP_SIZE:
        raise ValueError(f"{env_names.GROUP_SIZE}={text[:40]!r}: give a whole number of workers from 1 to "
                         f"{MAX_GROUP_SIZE} (ringmaster run --group-size sets it)")
    return value


def replica_group() -> ReplicaGroup:
    """This worker's replica group in the current generation (see the module's docstring).
    RuntimeError when the ring is not made of whole groups (a job started without the rendezvous
    forming its generations, with a size that is no multiple of the group size)."""
    k, my_rank, world = group_size(), rank(), size()
    if world % k:
        raise RuntimeError(f"the ring has {world} workers, not a whole number of groups of {k} "
                           f"({env_names.GROUP_SIZE}); start the job with ringmaster run --group-size {k}")
    return ReplicaGroup(my_rank // k, world // k, my_rank % k, k)
