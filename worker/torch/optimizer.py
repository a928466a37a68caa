"""`hvd.DistributedOptimizer`: average gradients across workers before each step.

As in Horovod, the wrapper is an instance of the wrapped optimizer's own class (so LR
schedulers and `isinstance` keep working) sharing its state. Gradients are reduced as one flat
buffer per dtype at `step()` (or `synchronize()`); with `backward_passes_per_step=k` the user
calls `step()` once per k backward passes and the accumulated gradients are reduced once.

With `op=hvd.Adasum` it works as Horovod's Adasum optimizer: each worker takes its optimizer
step on its own gradients, and the parameter deltas are combined with Adasum (one gather of a
flat buffer, each tensor combined on its own), so every worker applies the same update.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, TypeVar

import torch

from ringmaster.torch import adasum
from ringmaster.torch.basics import Sum, context, size
from ringmaster.torch.collectives import allreduce_
from ringmaster.torch.compression import Compression
from ringmaster.worker.train import flat as flat_buffers


class _DistributedOptimizerMixin:
    _hvd_op: str
    _hvd_compression: Any  # a compressor class, see ringmaster.torch.compression
    _hvd_params: list[torch.Tensor]
    _hvd_synchronized: bool
    _hvd_should_sync: bool
    _hvd_buffers: dict[tuple[torch.device, torch.dtype], torch.Tensor]
    backward_passes_per_step: int

    def synchronize(self) -> None:
        """Reduce gradients now (e.g. before clipping); `step()` then does not reduce again."""
        if self._hvd_op == "adasum":
            self._hvd_synchronized = True  # Adasum combines the updates in step(), not the gradients
            return
        grads = [p.grad for p in self._hvd_params if p.grad is not None]
        wire_dtype = getattr(self._hvd_compression, "wire_dtype", None)
        for group in flat_buffers.by_kind(grads):
            if wire_dtype is None:  # a compressor of the user's own: its compress/decompress, as given
                self._reduce_with(group)
            else:
                self._reduce_fused(group, wire_dtype(group[0].dtype))
        self._hvd_synchronized = True

    def _reduce_fused(self, group: list[torch.Tensor], wire: torch.dtype) -> None:
        """Pack into a buffer kept across steps (no fresh memory, so no page faults), cast into
        a kept wire buffer if compressing, sum across workers in place, and write each gradient
        back with the averaging folded into that copy: one pass over the bytes each way."""
        total = sum(g.numel() for g in group)
        flat = flat_buffers.pack(group, out=self._hvd_buffer(group[0].device, group[0].dtype, total))
        sent = flat
        if wire != flat.dtype:
            sent = self._hvd_buffer(flat.device, wire, total)
            sent.copy_(flat)
        allreduce_(sent, op=Sum)
        flat_buffers.unpack(sent, group, 1.0 / size() if self._hvd_op == "average" else 1.0)

    def _hvd_buffer(self, device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
        key = (device, dtype)
        buffer = self._hvd_buffers.get(key)
        if buffer is None or buffer.numel() != numel:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            self._hvd_buffers[key] = buffer
        return buffer

    def _reduce_with(self, group: list[torch.Tensor]) -> None:
        flat, ctx = self._hvd_compression.compress(flat_buffers.pack(group))
        allreduce_(flat, op=self._hvd_op)
        flat_buffers.unpack(self._hvd_compression.decompress(flat, ctx), group)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, `step()` does not reduce (use after an explicit `synchronize()`)."""
        self._hvd_should_sync = False
        try:
            yield
        finally:
            self._hvd_should_sync = True

    def step(self, closure=None):  # type: ignore[override]
        """Wait for the gradients' reduction (unless `skip_synchronize()`), then step the wrapped optimizer."""
        if self._hvd_op == "adasum":
            return self._adasum_step(closure)
        if self._hvd_should_sync and not self._hvd_synchronized:
            self.synchronize()
        self._hvd_synchronized = False
        return super().step(closure)  # type: ignore[misc]


    def _adasum_step(self, closure=None):
        params = [p for p in self._hvd_params if p.grad is not None]
        start = [p.detach().clone() for p in params]
        loss = super().step(closure)  # type: ignore[misc]
        self._hvd_synchronized = False
        if not params:
            return loss
        comm = context().communicator()
        with torch.no_grad():
            deltas = [p.detach() - s for p, s in zip(params, start)]  # each worker's own update
            origin = {id(d): s for d, s in zip(deltas, start)}
            target = {id(d): p for d, p in zip(deltas, params)}
            for group in flat_buffers.by_kind(deltas):
                reduced = adasum.reduce_slices(comm.allgather(flat_buffers.pack(group)), [d.numel() for d in group])
                for d, part in zip(group, flat_buffers.views(reduced, group)):
                    target[id(d)].copy_(origin[id(d)] + part)
        return loss


#: The wrapped optimizer's own class: `optimizer = hvd.DistributedOptimizer(optimizer)` keeps its type.
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


def DistributedOptimizer(
    optimizer: OptimizerT,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: Any = None,
    backward_passes_per_step: int = 1,
    op: str = "average",
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups=None,
    sparse_as_dense: bool = False,
) -> OptimizerT:
    """Wrap `optimizer` so `step()` averages (or sums, `op=hvd.Sum`) gradients across workers."""
    if op == "adasum" and backward_passes_per_step != 1:
        raise ValueError("op=hvd.Adasum takes one step per backward pass here; use backward_passes_per_step=1 or op=hvd.Average")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if named_parameters is not None:
        named = list(named_parameters)
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("named_parameters has duplicate names")
        params = [p for _, p in named]
    else:
        params = [p for group in optimizer.param_groups for p in group["params"]]
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizerMixin, optimizer.__class__), {})
    wrapped: Any = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._hvd_op = op
    wrapped._hvd_compression = compression or Compression.none
    wrapped._hvd_params = params
    wrapped._hvd_synchronized = False
    wrapped._hvd_should_sync = True
    wrapped._hvd_buffers = {}  # (device, dtype) -> fusion buffer kept across steps
    wrapped.backward_passes_per_step = backward_passes_per_step
    return wrapped
