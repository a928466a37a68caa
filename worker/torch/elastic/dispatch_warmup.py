"""A newcomer's DTensor dispatch warmed for the mesh it is likely to join, before it asks for a place.

DTensor works out how an operator runs on sharded tensors (sharding propagation) the first time it
meets the operator with given placements, shapes and mesh, and keeps the answer for the process.
Its key for a mesh is the mesh's shape and ranks, not its process groups: a survivor of a
generation change that meets a mesh of a shape it trained on before finds every answer kept, a
newcomer group finds none. In `bench/sharded.py` (2 groups of 2, Adam on 21 M parameters) a
newcomer's first optimizer step spent 0.29 s of its 0.35 s in 63 propagations, while the
survivors waited for it in the step's collectives: the first step with a new group was 0.26 s
longer than a step.

So a newcomer, which waits for its place anyway while the survivors train, builds the model once
on the meta device, on a mesh of the shape it is likely to join (its tentative size, which the
rendezvous gives it when it starts it) made over torch's fake process group (no communication,
nothing allocated), and steps each optimizer once with zero gradients, then loads its state back
(as the sync loads the commit a peer sends): what those need to know is then kept under the key
the real mesh will have. A wrong guess costs that CPU and nothing else: another shape (the job
changed again before the newcomer joined) is another key, and another rank in the same shape
drops what was kept (`dispatch_cache`: a decision kept names the mesh it was made on, this rank's
coordinate in it).

Nothing here is needed for correctness, so nothing is said when it cannot run: a build that fails
on the meta device, a torch without the fake backend. A job on GPUs is left as it was: its
optimizers take torch's foreach kernels on device tensors, which the meta device does not stand
in for, and building there would take the device's memory.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

from ringmaster.torch.basics import context
from ringmaster.torch.elastic import dispatch_cache
from ringmaster.torch.elastic.generation_mesh import hsdp_mesh
from ringmaster.torch.elastic.groups import group_size


def likely_mesh(in_ring: bool, started_by_rendezvous: bool, backend: str, tentative_rank: int,
                tentative_size: int, k: int) -> tuple[int, int, int] | None:
    """(groups, group size, rank) of the mesh a newcomer is likely to join, or None when there is
    nothing to warm: a worker already in a ring (its dispatch is warm, or it is a survivor), one a
    rendezvous did not start (no tentative size), a GPU job (see the module's docstring), a
    tentative size that is no whole number of groups."""
    if in_ring or not started_by_rendezvous or backend != "gloo":
        return None
    if k < 1 or tentative_size < k or tentative_size % k or not 0 <= tentative_rank < tentative_size:
        return None
    return tentative_size // k, k, tentative_rank


def warm(build: Callable[[Any], Mapping[str, Any]],
         then: Callable[[Mapping[str, Any]], None] | None = None) -> bool:
    """Warm this newcomer's DTensor dispatch for its likely mesh (see the module's docstring);
    `then(built)` is given what build() made there, stepped, before it is forgotten. True when
    an optimizer was stepped; False when there was nothing to warm or it could not run."""
    ctx = context()
    rank, size = ctx.topology()[:2]
    shape = likely_mesh(ctx.assignment is not None, ctx.link is not None and ctx.tentative_given, ctx.backend, rank,
                        size, group_size())
    if shape is None or dist.is_initialized():
        return False
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers torch's "fake" backend)
    except ImportError:  # pragma: no cover - another torch
        return False
    groups, k, rank = shape
    return stepped_on_fake_mesh(build, groups, k, rank, then)


def stepped_on_fake_mesh(build: Callable[[Any], Mapping[str, Any]], groups: int, k: int, rank: int,
                         then: Callable[[Mapping[str, Any]], None] | None = None) -> bool:
    """Build on the meta device on a fake (groups, k) mesh as `rank`, step every optimizer built
    once with zero gradients, give what was built to `then` (when an optimizer stepped), and
    forget it all (the process group too). The random number generator is left as it was:
    build() may seed it."""
    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=groups * k)
    built: Any = None
    mesh: Any = None
    try:
        with torch.random.fork_rng(devices=[]):
            mesh = hsdp_mesh("cpu", groups, k, timedelta(seconds=60))
            dispatch_cache.entering((groups, k), rank)  # (what it keeps holds for this rank only)
            try:
                with torch.device("meta"):
                    built = build(mesh)
            except Exception:  # (data-dependent code, an op meta tensors lack: its first step propagates)
                return False
            if not isinstance(built, Mapping):
                return False
            stepped = False
            for value in built.values():
                if isinstance(value, torch.nn.Module):
                    for parameter in value.parameters():
                        if parameter.requires_grad:
                            parameter.grad = torch.zeros_like(parameter)
            for value in built.values():
                if isinstance(value, torch.optim.Optimizer):
                    try:
                        value.step()
                        value.zero_grad(set_to_none=True)
                        value.load_state_dict(value.state_dict())  # (as a newcomer's sync loads the commit sent it)
                    except Exception:  # (an optimizer that reads values: meta tensors have none)
                        continue
                    stepped = True
            if stepped and then is not None:
                then(built)
            return stepped
    finally:
        del built, mesh  # (FSDP2's modules are cycles: `ShardedState` collects them before it freezes the heap)
        dist.destroy_process_group()
