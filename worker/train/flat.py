"""Flat buffers: many tensors sent as one (per device and dtype), the one home for packing.

A collective per tensor costs a round trip each; Horovod's tensor fusion and DDP's buckets
send many tensors in one buffer instead. Broadcasting parameters, reducing gradients and
combining Adasum deltas all pack this way.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch


def by_kind(tensors: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The tensors grouped by (device, dtype), each group and the groups in first-seen order
    (the same on every rank that passes the same tensors)."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


def pack(group: list[torch.Tensor]) -> torch.Tensor:
    """The group's elements one after another in one new 1-D tensor (gradient buckets pack into
    buffers of their own with `pack_scaled`)."""
    return torch.cat([t.detach().reshape(-1) for t in group])


def pack_scaled(group: list[torch.Tensor], views_out: list[torch.Tensor], scale: float) -> None:
    """Write each tensor of `group` into its view of a flat buffer, multiplied by `scale` and cast
    to the buffer's dtype on the way: one pass over the bytes (compression casts as it packs)."""
    with torch.no_grad():
        for t, view in zip(group, views_out):
            if scale != 1.0:
                torch.mul(t.detach(), scale, out=view)
            else:
                view.copy_(t)


def views(flat: torch.Tensor, group: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    """Consecutive slices of `flat`, each shaped like the matching tensor of `group`."""
    offset = 0
    for t in group:
        n = t.numel()
        yield flat[offset: offset + n].view_as(t)
        offset += n


def unpack(flat: torch.Tensor, group: list[torch.Tensor], scale: float = 1.0) -> None:
    """Write `flat` back into the tensors of `group` in place, multiplied by `scale` on the way
    (one pass over the bytes, no separate scaling pass)."""
    with torch.no_grad():
        for t, part in zip(group, views(flat, group)):
            if scale != 1.0:
                torch.mul(part, scale, out=t)
            else:
                t.copy_(part)
