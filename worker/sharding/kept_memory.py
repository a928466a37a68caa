"""A survivor's memory, carried from one generation's objects to the next's.

A `ShardedState` builds its model and optimizer again on every generation's mesh (a module
sharded on one mesh cannot move to another) and loads its commit into them. For a survivor the
new objects have the same shards as the old ones, of the same shapes, so instead of giving the
new modules fresh memory (`to_empty`: every page faulted in again as the commit is copied in)
they are given the old objects' local tensors, and when those still hold the commit the ring
goes on from (the worker left at a commit, the usual way a group is added), nothing is copied at
all. Each tensor is matched by its name in the state dict and must have the same shape, dtype
and device; any other gets fresh memory, as before.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.distributed.tensor import DTensor


def local_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state-dict tensors by name, each its local shard (a view, not a copy)."""
    return {name: (value.to_local() if isinstance(value, DTensor) else value).detach()
            for name, value in module.state_dict().items() if isinstance(value, torch.Tensor)}


def _apply_order(module: torch.nn.Module, prefix: str = "") -> Iterator[str]:
    """The names of the tensors `module._apply(fn)` hands to `fn`, in the order it does:
    children first, then the module's own parameters, then its buffers."""
    for name, child in module.named_children():
        yield from _apply_order(child, f"{prefix}{name}.")
    for name, parameter in module._parameters.items():
        if parameter is not None:
            yield prefix + name
    for name, buffer in module._buffers.items():
        if buffer is not None:
            yield prefix + name


def give_memory(module: torch.nn.Module, device: torch.device, kept: dict[str, torch.Tensor]) -> int:
    """Give a module built on the meta device memory on `device`, in place (parameters swapped,
    so an optimizer made with them still holds them): each tensor the kept tensor of its name
    where that fits, fresh uninitialized memory where not (what `to_empty` gives). FSDP2 takes
    the new local shards as its sharded parameters (its `_apply`). Returns how many tensors got
    fresh memory (0: every one is the kept tensor, with its values)."""
    names = iter(list(_apply_order(module)))
    fresh = 0

    def memory_for(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal fresh
        old = kept.get(next(names, ""))
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if old is None or old.shape != local.shape or old.dtype != local.dtype or old.device != device \
                or old.stride() != local.stride():
            fresh += 1
            return torch.empty_like(tensor, device=device)
        if isinstance(tensor, DTensor):
            return DTensor.from_local(old, tensor.device_mesh, tensor.placements, run_check=False, shape=tensor.shape,
                                      stride=tensor.stride())
        return old

    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module._apply(memory_for)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)
    return fresh


def fits(old: list[torch.Tensor], layout: Any, devices: list[torch.device]) -> bool:
    """Whether `old` (an optimizer's kept local state, flattened) can hold a commit entry of
    this layout ((shape, dtype) per tensor) on these devices."""
    return len(old) == len(layout) and all(
        tuple(t.shape) == tuple(shape) and t.dtype == dtype and t.device == device and t.is_contiguous()
        for t, (shape, dtype), device in zip(old, layout, devices))
