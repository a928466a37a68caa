"""`hvd.elastic.mesh()`: the generation's `DeviceMesh` of ("replicate", "shard"), for FSDP2.

A job in replica groups (`--group-size K`) shards its model inside each group and replicates it
across groups: PyTorch's HSDP, on a mesh of shape (groups, K). FSDP2 (`fully_shard`) and
DTensor take their mesh from torch's default process group, so each generation gets one of its
own: built on the rings' store under the generation's prefix (every member meets there, as on
the ring itself), with its rank and size, and destroyed when the next generation's is built.
A module sharded on one generation's mesh cannot move to the next one's: the model and its
optimizer are built again in each generation and the committed shards loaded into them, as
TorchTitan does after a restart (`ShardedState` does both).

Collectives on this mesh are torch's own, not Ringmaster's bounded ones: a peer killed fails
them at once (its connections close), which `hvd.elastic.run` turns into a rollback (an error
raised inside torch.distributed while the generation ended is a peer's failure there). A peer
that left a collective without dying (it failed in another one and rolled back) would hold the
others in it for the collective timeout: its process groups cannot be closed at once while
FSDP2's modules sharded on them stay referenced from torch's own caches. So the mesh's Gloo
connections are shut down when the generation is over and when the mesh is released
(`mesh_sockets`): every collective on it then fails at once, on every rank.
Where Gloo itself has already closed them, a collective posted as they closed can still wait for
its timeout: FSDP2's all-gathers and reduce-scatters of a `ShardedState`'s models are waited for
together with the generation's end (`guarded_comms`), and a mesh released with one still running
keeps its groups until it ends.

The model sharded on a released mesh is garbage in reference cycles (FSDP2's hooks and states
point back at their modules): its memory, a device's on a GPU, comes back only with a collection
of the cyclic garbage, which `release()` runs before the next generation builds its model. A
full collection walks every object of the process: 0.2-0.35 s with torch imported (265,000
objects), on every survivor's path back into training. So the objects there before the first
mesh (the imports, the dataset) are moved out of the collector's sight once (`gc.freeze()`,
after a collection, while the worker warms up) and each release walks only what was made
since: 0.04-0.08 s. What is frozen is never collected, which those long-lived objects never
needed.
"""

from __future__ import annotations

import gc
import os
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ringmaster.proto import environment as env_names
from ringmaster.torch.basics import context
from ringmaster.torch.elastic import dispatch_cache
from ringmaster.torch.elastic.groups import replica_group
from ringmaster.worker.sharding import guarded_comms, mesh_sockets

#: The mesh's dimensions, as TorchTitan and torchft name them.
MESH_DIMS = ("replicate", "shard")

_built: dict[str, Any] = {}  # "generation": the generation whose mesh is built, "mesh": it
#: Process groups of released meshes with collectives still running in Gloo (given up at their
#: generation's end, `guarded_comms`), with those collectives: dropped once they all ended.
_graveyard: list[tuple[list[dist.Work], list[Any]]] = []


def mesh() -> DeviceMesh:
    """The current generation's mesh of ("replicate", "shard"): shape (groups, group size),
    rank r at (r // K, r % K). Built on the first call in a generation (every member must call
    it: its construction is collective) and the same object after. RuntimeError when the
    script set up torch's default process group itself (the mesh needs it: use one or the
    other)."""
    ctx = context()
    assignment = ctx.assignment
    generation = assignment.generation if assignment is not None else 0
    if _built.get("generation") == generation and _built.get("mesh") is not None:
        return _built["mesh"]
    group = replica_group()
    release()
    freeze_heap()
    if dist.is_initialized():
        raise RuntimeError("hvd.elastic.mesh() builds torch's default process group for each generation, but the "
                           "script already initialized one (torch.distributed.init_process_group): let the mesh "
                           "make it, or build your own mesh without hvd.elastic.mesh()")
    rank, world = group.index * group.size + group.rank, group.count * group.size
    if assignment is not None and ctx.store is not None:
        store: dist.Store = dist.PrefixStore(f"{assignment.store_prefix}torch-world/", ctx.store)
    else:  # a worker on its own (no rendezvous): a world of one
        store = dist.HashStore()
    device_type = "cuda" if ctx.backend == "nccl" else "cpu"
    timeout = timedelta(seconds=ctx.timeout_s)
    before = mesh_sockets.open_sockets()
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", store=store, rank=rank, world_size=world,
                            timeout=timeout)
    built = hsdp_mesh(device_type, group.count, group.size, timeout)
    dispatch_cache.entering((group.count, group.size), rank)  # (DTensor's kept decisions: made at this rank?)
    sockets = mesh_sockets.opened_since(before) if device_type == "cpu" else {}
    released = threading.Event()
    if ctx.link is not None and sockets:
        mesh_sockets.cut_when_over(ctx.link, generation, sockets, released)
    _built.update(generation=generation, mesh=built, sockets=sockets, released=released)
    return built


def hsdp_mesh(device_type: str, groups: int, group_size: int, timeout: timedelta) -> DeviceMesh:
    """The (groups, group_size) mesh over the default group, its dimensions' groups made here
    with the collective timeout (`init_device_mesh` gives them torch's default, 30 minutes for
    Gloo: a collective whose peer left it would hold this rank that long). Every rank makes
    every group, in the same order, as `new_group` requires."""
    replicas = [[g * group_size + i for g in range(groups)] for i in range(group_size)]
    shards = [[g * group_size + i for i in range(group_size)] for g in range(groups)]
    replicate, _ = dist.new_subgroups_by_enumeration(replicas, timeout=timeout)
    shard, _ = dist.new_subgroups_by_enumeration(shards, timeout=timeout)
    layout = torch.arange(groups * group_size, dtype=torch.int).reshape(groups, group_size)
    built = DeviceMesh.from_group([replicate, shard], device_type, mesh=layout, mesh_dim_names=MESH_DIMS)
    built.__class__ = SlicesKept
    return built


class SlicesKept(DeviceMesh):  # type: ignore[misc,valid-type]
    """A generation's mesh that makes each of its slices once. FSDP2 slices the mesh for every
    parameter it shards (`mesh["shard"]`, a new `DeviceMesh` each time: 0.5 ms apiece, half of
    building a 21 M-parameter transformer's 51 parameters on a (2, 2) mesh, measured idle here),
    and every member builds its model again on the next generation's mesh while the ring waits
    for the slowest. A slice of the same names is the same mesh (equal by torch's own `__eq__`):
    the first one made is handed out again. Not kept when pickled (`__getstate__`): a copy
    slices afresh."""

    def __getitem__(self, mesh_dim_names: str | tuple[str, ...]) -> DeviceMesh:
        key = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
        kept = self.__dict__.setdefault("_ringmaster_slices", {})
        if key not in kept:
            kept[key] = super().__getitem__(mesh_dim_names)
        return kept[key]

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_ringmaster_slices", None)
        return state


def freeze_heap() -> None:
    """Collect the cyclic garbage once, then leave every object there now out of later
    collections (`gc.freeze`), so that `release()`'s collection walks only what was made since;
    once per process, however often called, and only in a worker a rendezvous started (a
    process that only uses the API, a test or a notebook, keeps its collector as it was)."""
    if not _built.get("frozen") and env_names.RENDEZVOUS in os.environ:
        gc.collect()
        gc.freeze()
        _built["frozen"] = True


def release() -> None:
    """Destroy the mesh's process groups and close their connections (`hvd.elastic.run` does it
    at every reset, before this worker waits for its next ring); nothing when there are none.

    Closing them is what frees a peer still inside one of their collectives: Gloo's `abort()`
    and `shutdown()` leave a collective blocked on this rank (measured, torch 2.13), and only
    freeing the process group closes its sockets, which fails the peer's collective at once
    ("Connection closed by peer") instead of after the collective timeout. So every reference is
    dropped here (torch's registry, the mesh) and the cycles of modules sharded on it collected
    (which also gives their memory back before the next model is built): a script that keeps its
    model beyond the training function keeps the groups open."""
    released = _built.pop("released", None)
    if released is not None:
        released.set()
    mesh_sockets.cut(_built.pop("sockets", {}))  # (a peer blocked on this rank fails now, freed or not)
    built = _built.pop("mesh", None)
    if built is not None and dist.is_initialized():
        pending = guarded_comms.pending_abandoned()
        if pending:  # a Gloo group's destructor waits for its work: kept until its abandoned collectives end
            _graveyard.append((pending, [dist.group.WORLD, *(built.get_group(d) for d in range(built.ndim))]))
        del built
        dist.destroy_process_group()
        gc.collect()
    _graveyard[:] = [(works, groups) for works, groups in _graveyard if not all(w.is_completed() for w in works)]
    _built.pop("generation", None)
