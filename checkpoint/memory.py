"""In-memory commits: the last committed state in host buffers allocated once and reused.

Horovod deep-copies every `state_dict()` at each commit, on the tensors' own device (a GPU job
doubles its GPU memory) into freshly allocated memory (first-touch page faults make a fresh
1 GB copy ~20x slower than a copy into memory already touched, measured here). A
`HostSnapshot` instead copies the state's tensors into one flat host buffer per dtype (pinned
when the state lives on CUDA, so device-to-host copies run at full speed), allocated when the
layout first appears and reused for every later commit. Plain objects are deep-copied (they are
small: epoch counters, sampler positions, optimizer hyperparameters).

The snapshot holds named entries (`{"model": model.state_dict(), "epoch": 3, ...}`); each entry
can be copied back in place into a live tree of the same layout, or rebuilt as a fresh copy.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping

import torch

from ringmaster.checkpoint.digest import buffers_digest
from ringmaster.checkpoint.tree import Layout, flatten, layout_of, tensor_refs, unflatten


class HostSnapshot:
    """The committed copy of a state. `capture` overwrites it; nothing else changes it."""

    def __init__(self) -> None:
        self.skeleton: dict[str, Any] = {}
        self.layout: Layout = ()
        #: One flat buffer per dtype, in a fixed order (what sync sends and receives).
        self.buffers: list[torch.Tensor] = []
        #: Views into `buffers`, one per tensor of the state, in flatten order.
        self.tensors: list[torch.Tensor] = []
        self.ranges: dict[str, tuple[int, int]] = {}
        self.devices: list[torch.device] = []
        self.pinned = False
        #: How often buffers were allocated: a steady state allocates once.
        self.allocations = 0

    # ------------------------------------------------------------ commit
    def capture(self, entries: Mapping[str, Any]) -> None:
        """Copy `entries` (live trees, not modified) into the snapshot."""
        skeleton: dict[str, Any] = {}
        live: list[torch.Tensor] = []
        ranges: dict[str, tuple[int, int]] = {}
        for name, tree in entries.items():
            skeleton[name], tensors = flatten(tree, start=len(live))
            ranges[name] = (len(live), len(live) + len(tensors))
            live.extend(tensors)
        on_cuda = any(t.is_cuda for t in live)
        self._allocate(layout_of(live), pin=on_cuda)
        copy_tensors(self.tensors, live)
        self.skeleton = copy.deepcopy(skeleton)
        self.ranges = ranges
        self.devices = [t.device for t in live]

    def copy_from(self, other: "HostSnapshot") -> None:
        """Become a copy of `other`: its few flat buffers copied into ours (host to host, reused)."""
        self._allocate(other.layout, pin=False)
        copy_tensors(self.buffers, other.buffers)
        self.skeleton = copy.deepcopy(other.skeleton)
        self.ranges = dict(other.ranges)
        self.devices = list(other.devices)

    def incoming(self, skeleton: dict[str, Any], spare: "HostSnapshot | None" = None) -> "HostSnapshot":
        """A new snapshot with another process' skeleton and fresh buffers of its layout, to
        receive its bytes into. This commit stays as it was until `replace` takes the new one:
        a sync whose sender dies halfway must leave the receiver's last commit whole (it rolls
        back to it), never a mix of the sender's objects and half-received buffers.

        `spare` (a snapshot that holds no commit, its buffers `reserve`d): its buffers are taken
        instead of fresh ones where they have the layout (it is left with none)."""
        refs = sorted(tensor_refs(skeleton), key=lambda r: r.index)
        layout = tuple((r.shape, r.dtype) for r in refs)
        staged = HostSnapshot()
        if spare is not None and spare.allocations and not spare.skeleton and spare.layout == layout \
                and not self.pinned and not spare.pinned:
            staged.buffers, staged.tensors, staged.layout, staged.allocations = (
                spare.buffers, spare.tensors, spare.layout, spare.allocations)
            spare.buffers, spare.tensors, spare.layout, spare.allocations = [], [], (), 0
        else:
            staged._allocate(layout, pin=self.pinned)
        staged.skeleton = skeleton
        staged.ranges = {name: _range(sub) for name, sub in skeleton.items()}
        staged.devices = list(self.devices) if len(self.devices) == len(refs) else [torch.device("cpu")] * len(refs)
        return staged

    def replace(self, other: "HostSnapshot", old_to: "HostSnapshot | None" = None) -> None:
        """Become `other` (its buffers taken, not copied): the end of a sync that received it whole.
        `old_to` (a snapshot left with no buffers: the spare `incoming` took) is given this one's
        buffers, holding no commit, for a later commit to be written into."""
        if old_to is not None and not old_to.allocations and self.allocations:
            old_to.buffers, old_to.tensors, old_to.layout, old_to.pinned, old_to.allocations = (
                self.buffers, self.tensors, self.layout, self.pinned, 1)
            old_to.forget()
        self.skeleton, self.layout, self.buffers, self.tensors = (
            other.skeleton,
            other.layout,
            other.buffers,
            other.tensors,
        )
        self.ranges, self.devices, self.pinned = other.ranges, other.devices, other.pinned
        self.allocations += other.allocations

    def forget(self) -> None:
        """Hold no commit any more, its buffers kept (their pages faulted in already): a spare for
        `incoming` to receive into, or for the next `capture` to write into."""
        self.skeleton, self.ranges, self.devices = {}, {}, []

    def reserve(self, layout: Layout) -> None:
        """Host buffers of `layout` allocated and every page of them touched now, in a snapshot that
        holds no commit yet: a newcomer's, while it waits for its place, so that the commit it is
        sent and its own first commit are written into memory already faulted in (fresh memory
        costs about 5x a copy into touched memory: 0.1 s for 120 MB here, while its ring waits)."""
        if self.skeleton:
            raise ValueError("reserve() is for a snapshot that holds no commit")
        self._allocate(layout, pin=False)
        for buffer in self.buffers:
            buffer.zero_()

    def _allocate(self, layout: Layout, pin: bool) -> None:
        pin = pin and torch.cuda.is_available()
        if layout == self.layout and pin == self.pinned and self.allocations:
            return
        totals: dict[torch.dtype, int] = {}
        for shape, dtype in layout:
            totals[dtype] = totals.get(dtype, 0) + math.prod(shape)
        order = sorted(totals, key=str)
        buffers = {dtype: torch.empty(totals[dtype], dtype=dtype, pin_memory=pin) for dtype in order}
        offsets = dict.fromkeys(order, 0)
        views = []
        for shape, dtype in layout:
            n = math.prod(shape)
            views.append(buffers[dtype][offsets[dtype]: offsets[dtype] + n].view(shape))
            offsets[dtype] += n
        self.buffers = [buffers[dtype] for dtype in order]
        self.tensors = views
        self.layout = layout
        self.pinned = pin
        self.allocations += 1

    # ------------------------------------------------------------ restore
    def copy_into(self, name: str, live: Any) -> bool:
        """Copy entry `name`'s tensors into `live` (a tree of the same layout) in place.
        False, and nothing copied, when the layouts differ."""
        _, tensors = flatten(live)
        start, stop = self.ranges[name]
        if layout_of(tensors) != self.layout[start:stop]:
            return False
        with torch.no_grad():
            copy_tensors(tensors, self.tensors[start:stop])
        return True

    def fits(self, name: str, live: Any) -> bool:
        """Whether `live` has entry `name`'s layout (what `copy_into` would copy into)."""
        _, tensors = flatten(live)
        start, stop = self.ranges[name]
        return layout_of(tensors) == self.layout[start:stop]

    def materialize(self, name: str, into: list[torch.Tensor] | None = None, copy_values: bool = True) -> Any:
        """A fresh copy of entry `name` that shares nothing with the snapshot (tensors go back to
        the device they were committed from). With `into` (tensors of the entry's layout, in its
        order, on those devices), its tensors are those, the values copied in unless
        `copy_values` is False (they hold them already)."""
        start, stop = self.ranges[name]
        tensors: list[torch.Tensor] = list(self.tensors)
        if into is not None:
            if copy_values:
                with torch.no_grad():
                    copy_tensors(into, self.tensors[start:stop])
            tensors[start:stop] = into
        else:
            for i in range(start, stop):
                tensors[i] = self.tensors[i].to(self.devices[i], copy=True)
        return unflatten(copy.deepcopy(self.skeleton[name]), tensors)

    def entry_layout(self, name: str) -> tuple[Layout, list[torch.device]]:
        """Entry `name`'s layout ((shape, dtype) per tensor) and the devices it was committed from."""
        start, stop = self.ranges[name]
        return self.layout[start:stop], list(self.devices[start:stop])

    def plain(self, name: str) -> Any:
        """Entry `name`'s skeleton: its objects, with `TensorRef`s where its tensors are."""
        return self.skeleton[name]

    def export(self) -> dict[str, Any]:
        """The whole snapshot as a tree whose tensors are views of the buffers (no copy): what
        a durable checkpoint writes."""
        return unflatten(self.skeleton, self.tensors)

    # ------------------------------------------------------------ comparing
    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def data_digest(self) -> int:
        """A 64-bit digest (XXH3) of every byte of the buffers: equal commits give equal digests,
        and any changed or swapped value changes it. Runs faster than a plain memory copy."""
        return buffers_digest(self.buffers)


def entries_layout(entries: Mapping[str, Any]) -> Layout:
    """The layout a commit of `entries` takes (`capture`'s: each entry's tensors in its order)."""
    return layout_of([tensor for tree in entries.values() for tensor in flatten(tree)[1]])


def copy_tensors(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """dst[i].copy_(src[i]) for all i, in one foreach call where devices allow, then wait for
    device-to-host copies."""
    if not destinations:
        return
    try:
        torch._foreach_copy_(destinations, sources, non_blocking=True)
    except RuntimeError:
        for dst, src in zip(destinations, sources):
            dst.copy_(src, non_blocking=True)
    if torch.cuda.is_available() and any(t.is_cuda for t in (*destinations, *sources)):
        torch.cuda.synchronize()


def _range(skeleton: Any) -> tuple[int, int]:
    indices = [r.index for r in tensor_refs(skeleton)]
    return (min(indices), max(indices) + 1) if indices else (0, 0)
