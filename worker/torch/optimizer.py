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
import warnings
from typing import Any, Iterable, TypeVar

import torch

from ringmaster.common.spans import SpanRecorder, now_us
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.torch import adasum
from ringmaster.torch.basics import context
from ringmaster.torch.buckets import GradientBuckets, take_over
from ringmaster.torch.collectives import allreduce_, sparse_allreduce_async, synchronize
from ringmaster.torch.compression import Compression
from ringmaster.torch.process_sets import ProcessSet, global_process_set, ring_of
from ringmaster.worker.train import flat as flat_buffers
from ringmaster.worker.train.op_queue import fusion_threshold


class _DistributedOptimizerMixin:
    _hvd_op: str
    _hvd_compression: Any  # a compressor class, see ringmaster.torch.compression
    _hvd_params: list[torch.Tensor]
    _hvd_synchronized: bool
    _hvd_should_sync: bool
    _hvd_buckets: GradientBuckets | None
    _hvd_reduces: bool
    _hvd_process_set: ProcessSet
    _hvd_sum_scale: float | None  # set by a global batch: sum the ring's gradients, times this
    backward_passes_per_step: int

    def synchronize(self) -> None:
        """Reduce gradients now (e.g. before clipping); `step()` then does not reduce again."""
        if self._hvd_op == "adasum":
            self._hvd_synchronized = True  # Adasum combines the updates in step(), not the gradients
            return
        if not self._hvd_reduces:  # not in its process set, or a job of one: its own gradients as they are
            self._hvd_synchronized = True
            return
        if self._hvd_buckets is not None:
            self._hvd_buckets.synchronize()  # most buckets went out during backward already
        else:  # a compressor of the user's own: its compress/decompress, as given, at step()
            for group in flat_buffers.by_kind([p.grad for p in self._hvd_params if p.grad is not None]):
                self._reduce_with(group)
        self._hvd_synchronized = True

    def _reduce_with(self, group: list[torch.Tensor]) -> None:
        flat, ctx = self._hvd_compression.compress(flat_buffers.pack(group))
        if self._hvd_sum_scale is None:
            allreduce_(flat, op=self._hvd_op, process_set=self._hvd_process_set)
            flat_buffers.unpack(self._hvd_compression.decompress(flat, ctx), group)
            return
        allreduce_(flat, op="sum", process_set=self._hvd_process_set)
        flat_buffers.unpack(self._hvd_compression.decompress(flat, ctx).mul_(self._hvd_sum_scale), group)

    def set_accumulation(self, passes: int, sum_scale: float | None, exact: bool = False) -> None:
        """A global batch's terms for this generation (`ElasticSampler(global_batch_size=...)`,
        applied by `TorchState` at every reset): `passes` backward passes (this rank's
        micro-batches; 0 for a rank given none, which contributes zeros) accumulate before a step
        reduces them, and the ring's gradients are summed and multiplied by `sum_scale` (one over
        the micro-batches of a step) instead of averaged over the ranks; `None` goes back to
        Horovod's average. `exact`: sum in float64 and round once (`buckets.GradientBuckets.exact`),
        so that the result has the same bits whatever the number of ranks; it needs the
        optimizer's own buckets (a compressor of the user's own reduces in the gradients' dtype,
        said once). Gradients accumulated so far are dropped: a reset starts a step afresh."""
        if self._hvd_op == "adasum" and sum_scale is not None:
            raise ValueError("a global batch sums the ring's gradients: it cannot be used with op=hvd.Adasum")
        if sum_scale is not None and self._hvd_process_set.process_set_id != 0:
            raise ValueError("a global batch is shared by the whole ring: wrap the optimizer with the global process "
                             "set")
        if passes < 0 or (sum_scale is not None and not sum_scale > 0):
            raise ValueError(f"set_accumulation(passes={passes}, sum_scale={sum_scale}): give passes >= 0 and a "
                             "positive scale")
        self._hvd_sum_scale = sum_scale
        self.set_backward_passes_per_step(max(1, passes))
        if exact and sum_scale is not None and self._hvd_buckets is None and not getattr(self,
                                                                                         "_hvd_exact_warned", False):
            self._hvd_exact_warned = True
            warnings.warn("a global batch's exact sums need DistributedOptimizer's own compression (none, fp16 or "
                          "bf16): with a compressor of your own the step's gradients are summed in their dtype, equal "
                          "across world sizes up to the order of the sums")
        if self._hvd_buckets is not None:
            self._hvd_buckets.exact = exact and sum_scale is not None
            self._hvd_buckets.clear()
        else:
            for p in self._hvd_params:
                p.grad = None
        self._hvd_synchronized = False

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Horovod's: how many backward passes accumulate before a step reduces them."""
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self.backward_passes_per_step = passes
        if self._hvd_buckets is not None:
            self._hvd_buckets.passes_per_step = passes

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
        if self._hvd_should_sync and self._hvd_synchronized and self._hvd_op != "adasum":
            warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                          "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
                          "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.")
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


    def local_step(self, closure=None):
        """The wrapped optimizer's own step on this worker's gradients as they are, reducing nothing."""
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
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> OptimizerT:
    """Wrap `optimizer` so `step()` averages (or sums, `op=hvd.Sum`) gradients across workers
    (across the workers of `process_set`; a worker outside it steps on its own gradients), with
    Horovod's signature and checks. Sparse gradients (`nn.Embedding(sparse=True)`) are reduced
    as sparse tensors (their indices and values gathered), or as dense ones with
    `sparse_as_dense=True`; either way they stay sparse for the optimizer. `num_groups` and
    `groups` (Horovod's fusion groups) are checked and accepted: gradients are fused by size here."""
    if op == "adasum" and backward_passes_per_step != 1:
        raise ValueError("op=hvd.Adasum takes one step per backward pass here; use backward_passes_per_step=1 or "
                         "op=hvd.Average")
    if gradient_predivide_factor <= 0 or (gradient_predivide_factor != 1.0 and op != "average"):
        raise ValueError(f"gradient_predivide_factor must be positive and needs op=hvd.Average, got "
                         f"{gradient_predivide_factor} with op={op!r}")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    _check_groups(groups if groups is not None else num_groups)
    names = _parameter_names(optimizer, named_parameters)
    params = list(names)
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizerMixin, optimizer.__class__), {})
    wrapped: Any = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._hvd_op = op
    wrapped._hvd_compression = compression or Compression.none
    wrapped._hvd_params = params
    wrapped._parameter_names = names  # (Horovod's attribute: parameter -> its name)
    wrapped._hvd_process_set = process_set
    wrapped._hvd_reduces = bool(process_set.included())
    wrapped._hvd_synchronized = False
    wrapped._hvd_should_sync = True
    wrapped.backward_passes_per_step = backward_passes_per_step
    wrapped._hvd_sum_scale = None
    wrapped.sparse_as_dense = sparse_as_dense
    wrapped.process_set = process_set
    wrapped._hvd_buckets = None
    wire_dtype = getattr(wrapped._hvd_compression, "wire_dtype", None)
    if op == "adasum" or wire_dtype is None or not wrapped._hvd_reduces:
        take_over([p for p in params if p.requires_grad], None)  # reduced at step(): no other optimizer's hooks
    else:
        average = op == "average"
        wrapped._hvd_buckets = GradientBuckets(
            [p for p in params if p.requires_grad],
            fusion_threshold(),
            backward_passes_per_step,
            wire_dtype,
            lambda: ring_of(process_set),
            prescale=lambda: (
                1.0 if wrapped._hvd_sum_scale is not None or not average else 1.0 / gradient_predivide_factor
            ),
            postscale=lambda: (
                wrapped._hvd_sum_scale
                if wrapped._hvd_sum_scale is not None
                else gradient_predivide_factor / ring_of(process_set).size
                if average
                else 1.0
            ),
            spans=_worker_spans(),
            sparse=None if sparse_as_dense else lambda grads: _reduce_sparse(grads, op, process_set),
        )
    return wrapped


def _parameter_names(optimizer: torch.optim.Optimizer,
                     named_parameters: Iterable[tuple[str, torch.Tensor]] | None) -> dict[torch.Tensor, str]:
    """Every parameter of `optimizer` with its name, in the optimizer's order; Horovod's checks:
    `named_parameters` a sequence of (name, parameter) tuples with unique names that name every
    parameter the optimizer holds (without it, names are made as Horovod makes them)."""
    ordered = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, group in enumerate(optimizer.param_groups)
                for j, p in enumerate(group["params"])}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                         "model.named_parameters().")
    seen: set[str] = set()
    duplicates = sorted({n for n, _ in named if n in seen or seen.add(n)})  # type: ignore[func-returns-value]
    if duplicates:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         f"{', '.join(duplicates)}")
    by_id = {id(p): n for n, p in named}
    unnamed = [p for p in ordered if id(p) not in by_id]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named "
                         f"({len(unnamed)} of the optimizer's {len(ordered)}, shapes "
                         f"{[tuple(p.shape) for p in unnamed][:4]}): pass model.named_parameters() of the whole model")
    return {p: by_id[id(p)] for p in ordered}


def _check_groups(groups: Any) -> None:
    """Horovod's check of its fusion groups: a non-negative count, or lists of distinct tensors."""
    if isinstance(groups, list):
        seen: set[int] = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
    elif not isinstance(groups, int) or groups < 0:
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")


def _reduce_sparse(grads: list[torch.Tensor], op: str, process_set: ProcessSet) -> list[torch.Tensor]:
    """Sparse gradients reduced as Horovod reduces them: every worker's indices and values
    gathered (one pair of allgathers each, issued together), then summed or averaged."""
    handles = [sparse_allreduce_async(g, name=f"ringmaster.sparse_grad.{i}", op=op, process_set=process_set)
               for i, g in enumerate(grads)]
    return [synchronize(h) for h in handles]
