"""`hvd.DistributedOptimizer`: average gradients across workers before each step.

As in Horovod, the wrapper is an instance of the wrapped optimizer's own class (so LR
schedulers and `isinstance` keep working) sharing its state. Gradients are reduced in buckets
while backward runs (`buckets`: a hook per parameter, buckets of up to HOROVOD_FUSION_THRESHOLD
bytes); `step()` (or `synchronize()`) waits for them. With `backward_passes_per_step=k` the
user calls `step()` once per k backward passes and the accumulated gradients are reduced once.
A compressor of the user's own (no `wire_dtype`) is applied as given, at `step()`.

With `op=hvd.Adasum` it works as Horovod's Adasum optimizer: each worker takes its optimizer
step on its own gradients, and the parameter deltas are combined with Adasum (one gather of a
flat buffer, each tensor combined on its own), so every worker applies the same update.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterable, TypeVar

import torch

from ringmaster.common.spans import SpanRecorder, now_us
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.torch import adasum
from ringmaster.torch.basics import context, size
from ringmaster.torch.buckets import GradientBuckets, take_over
from ringmaster.worker.train.op_queue import fusion_threshold
from ringmaster.torch.collectives import allreduce_
from ringmaster.torch.compression import Compression
from ringmaster.worker.train import flat as flat_buffers


class _DistributedOptimizerMixin:
    _hvd_op: str
    _hvd_compression: Any  # a compressor class, see ringmaster.torch.compression
    _hvd_params: list[torch.Tensor]
    _hvd_synchronized: bool
    _hvd_should_sync: bool
    _hvd_buckets: GradientBuckets | None
    backward_passes_per_step: int

    def synchronize(self) -> None:
        """Reduce gradients now (e.g. before clipping); `step()` then does not reduce again."""
        if self._hvd_op == "adasum":
            self._hvd_synchronized = True  # Adasum combines the updates in step(), not the gradients
            return
        if self._hvd_buckets is not None:
            self._hvd_buckets.synchronize()  # most buckets went out during backward already
        else:  # a compressor of the user's own: its compress/decompress, as given, at step()
            for group in flat_buffers.by_kind([p.grad for p in self._hvd_params if p.grad is not None]):
                self._reduce_with(group)
        self._hvd_synchronized = True

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

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """The wrapped optimizer's (with its own arguments); with a timeline, the step's forward
        is told from here."""
        super().zero_grad(*args, **kwargs)  # type: ignore[misc]
        buckets = self._hvd_buckets
        if buckets is not None and buckets.spans.on:
            buckets.forward_from_us = now_us()

    def step(self, closure=None):  # type: ignore[override]
        """Wait for the gradients' reduction (unless `skip_synchronize()`), then step the wrapped optimizer."""
        if self._hvd_op == "adasum":
            context().note_step()
            return self._adasum_step(closure)
        waited = 0.0
        if self._hvd_should_sync and not self._hvd_synchronized:
            started = time.perf_counter()
            self.synchronize()
            waited = time.perf_counter() - started
        context().note_step(waited)
        self._hvd_synchronized = False
        buckets = self._hvd_buckets
        if buckets is None or not buckets.spans.on:
            return super().step(closure)  # type: ignore[misc]
        started = now_us()
        try:
            return super().step(closure)  # type: ignore[misc]
        finally:
            ended = now_us()
            buckets.spans.add(pb.SPAN_OPTIMIZER_STEP, started, ended)
            buckets.forward_from_us = ended  # the next forward starts here unless zero_grad() comes later


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


def _worker_spans() -> SpanRecorder | None:
    """This worker's timeline recorder (None before `hvd.init()`: no timeline then)."""
    try:
        return context().spans
    except ValueError:
        return None


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
    if gradient_predivide_factor <= 0 or (gradient_predivide_factor != 1.0 and op != "average"):
        raise ValueError(f"gradient_predivide_factor must be positive and needs op=hvd.Average, got "
                         f"{gradient_predivide_factor} with op={op!r}")
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
    wrapped.backward_passes_per_step = backward_passes_per_step
    wrapped._hvd_buckets = None
    wire_dtype = getattr(wrapped._hvd_compression, "wire_dtype", None)
    if op == "adasum" or wire_dtype is None:
        take_over([p for p in params if p.requires_grad], None)  # reduced at step(): no other optimizer's hooks
    else:
        average = op == "average"
        wrapped._hvd_buckets = GradientBuckets(
            [p for p in params if p.requires_grad], fusion_threshold(), backward_passes_per_step, wire_dtype,
            lambda: context().communicator(),
            prescale=lambda: 1.0 / gradient_predivide_factor if average else 1.0,
            postscale=lambda: gradient_predivide_factor / size() if average else 1.0,
            spans=_worker_spans(),
        )
    return wrapped
