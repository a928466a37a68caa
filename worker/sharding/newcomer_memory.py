"""A newcomer's memory for the place it is likely to take, faulted in while it waits for it.

A newcomer to a sharded job (a replica group added) holds nothing of the model until its sync:
there it receives a peer's commit into fresh host buffers, copies it into its freshly built
shards and optimizer state, and its first commit copies them into fresh buffers again. Fresh
memory is page-faulted as it is first written, about 5x the cost of a copy into memory already
touched (0.1 s for 120 MB on this machine): three times the size of its shards, all of it while
the survivors wait for it, in the sync and in the first step's collectives.

While it waits for its place (the survivors still train), the newcomer builds its objects once
on the meta device on the mesh it is likely to join (`dispatch_warmup`); from them this gives
it that memory now, every page touched: each module's and optimizer's local tensors (taken by
the real build as a survivor's kept memory is, `kept_memory`) and the host buffers of the
commit it will be sent and of its own first one (`HostSnapshot.reserve`). It is the memory the
worker holds anyway once it trains. A wrong guess (the job changed again before it joined)
fits nothing and is freed at the sync: fresh memory is taken then, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from ringmaster.checkpoint.memory import HostSnapshot
from ringmaster.checkpoint.tree import Layout


@dataclass
class NewcomerMemory:
    """What a newcomer reserved: `kept` as `ShardedState`'s kept memory (a module's name: its
    local tensors by name; an optimizer's: its state tensors, flat, in the commit's order), and
    `staging` for the commit a peer sends it."""

    kept: dict[str, Any] = field(default_factory=dict)
    staging: HostSnapshot = field(default_factory=HostSnapshot)


def touched_like(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of `tensor`'s shape and dtype (a meta one's too), contiguous, every page written."""
    return torch.zeros(tuple(tensor.shape), dtype=tensor.dtype)


def reserve(memories: Mapping[str, Any], layout: Layout) -> NewcomerMemory:
    """`memories`: what each object built on the meta device would keep (`ShardedModule.memory`,
    `ShardedOptimizer.memory`: meta tensors); `layout`: that of the commit those objects make.
    Returns their memory on the CPU and the staging buffers, all touched."""
    reserved = NewcomerMemory()
    for name, memory in memories.items():
        if isinstance(memory, dict):
            reserved.kept[name] = {key: touched_like(t) for key, t in memory.items() if isinstance(t, torch.Tensor)}
        elif isinstance(memory, list):
            reserved.kept[name] = [touched_like(t) for t in memory]
    reserved.staging.reserve(layout)
    return reserved

