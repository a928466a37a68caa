"""Gradient buckets reduced while backward runs: Horovod's tensor fusion and DDP's buckets.

Parameters are split into buckets (per device and dtype, in reverse order of the model's
parameters, as their gradients tend to become ready; each at most the fusion threshold in
bytes). A hook after each gradient's accumulation marks it ready; when every gradient of a
bucket is ready, the bucket is packed into its wire buffer, kept across steps (cast on the way
when compressing), and its allreduce starts while backward goes on. Buckets start in one fixed
order on every rank (a ready bucket waits for the ones before it), as the rings require.
`synchronize()` starts what is left (a parameter without a gradient this step counts as zeros,
as in Horovod), waits for every bucket in order and writes the averages back, the division
and the cast back from the wire dtype folded into that one copy. (Leaving the gradients as
views of the reduced buffer instead, with the division taken while packing, measured a few
percent slower on the 100 MB model: the copy back is not where the time goes.)

After a generation's first step the buckets are rebuilt in the order gradients really became
ready on rank 0 (DDP's `_rebuild_buckets`); every new ring starts from the default layout again,
so survivors and newcomers plan alike.

With `backward_passes_per_step=k`, a gradient counts as ready on its k-th accumulation only.
A failed collective (a peer died) clears the whole step, gradients included, before the error
reaches `hvd.elastic.run`: nothing half-reduced is left behind to be applied after the rollback.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ringmaster.common.spans import SpanRecorder, now_us
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.worker.train import flat
from ringmaster.worker.train.collectives import Pending
from ringmaster.worker.train.errors import HorovodInternalError

#: The first bucket of each kind is at most this big (DDP's first bucket is 1 MB too): the
#: gradients ready first go out while backward computes the rest.
FIRST_BUCKET_BYTES = 1 << 20
#: The attribute by which a parameter knows the buckets that hear its gradients.
_OWNER = "_ringmaster_buckets"


def plan_buckets(params: list[torch.Tensor], threshold_bytes: int,
                 first_bytes: int = FIRST_BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """Parameters in buckets, in reverse order of `params` (the order gradients tend to become
    ready in): see `plan_buckets_in_order`."""
    return plan_buckets_in_order(list(reversed(params)), threshold_bytes, first_bytes)


def plan_buckets_in_order(params: list[torch.Tensor], threshold_bytes: int,
                          first_bytes: int = FIRST_BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """Parameters in buckets, in the order given (the order their gradients become ready), one
    (device, dtype) per bucket, at most `threshold_bytes` each (a larger tensor is a bucket of
    its own). The first bucket of each kind takes tensors until it holds `first_bytes` (as DDP's
    first bucket does: the tensor that crosses the mark joins it), so that communication starts
    while backward computes the rest. Pure, and the same on every rank given the same order."""
    buckets: list[list[torch.Tensor]] = []
    first_done: set[tuple[torch.device, torch.dtype]] = set()
    open_bucket: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[int]]] = {}
    for p in params:
        key = (p.device, p.dtype)
        nbytes = p.numel() * p.element_size()
        current = open_bucket.get(key)
        if current is not None and current[0] and current[1][0] + nbytes > threshold_bytes:
            first_done.add(key)  # full: the next bucket of this kind begins
            current = None
        if current is None:
            current = ([], [0])
            open_bucket[key] = current
            buckets.append(current[0])
        current[0].append(p)
        current[1][0] += nbytes
        if key not in first_done and current[1][0] >= min(first_bytes, threshold_bytes):
            first_done.add(key)
            open_bucket.pop(key)  # the first bucket holds enough to start early: closed
    return buckets


def take_over(params: list[torch.Tensor], owner: "GradientBuckets | None") -> None:
    """One DistributedOptimizer per parameter hears its gradients: the newest. An older one's
    hooks are removed (it still reduces everything at its `synchronize()`)."""
    for p in params:
        previous = getattr(p, _OWNER, None)
        old = previous() if previous is not None else None
        if old is not None and old is not owner:
            old.remove()
        setattr(p, _OWNER, weakref.ref(owner) if owner is not None else None)


#: Values of a gradient widened to float64 at a time when summed exactly on the CPU (2 MB).
_WIDEN_CHUNK = 1 << 18


@dataclass
class _Bucket:
    params: list[torch.Tensor]
    ready: int = 0
    pending: Pending | None = None
    wire: torch.Tensor | None = None  # what travels: the packed gradients (cast when compressing), kept across steps
    views: list[torch.Tensor] = field(default_factory=list)  # of `wire`, one shaped like each dense gradient
    grads: list[torch.Tensor] = field(default_factory=list)  # this step's dense gradients, in wire order
    dense: tuple[int, ...] = ()  # which parameters the wire carries (ids): all but those with sparse gradients
    sparse: list[torch.Tensor] = field(default_factory=list)  # this step's parameters with sparse gradients
    resparsify: list[torch.Tensor] = field(default_factory=list)  # sparse ones carried dense (sparse_as_dense)
    carriers: list[torch.Tensor] = field(default_factory=list)  # the parameters whose gradients `grads` are, in order

    def resparsify_grads(self) -> list[torch.Tensor]:
        """The reduced gradients of the sparse ones carried dense (to be made sparse again)."""
        return [p.grad for p in self.resparsify if p.grad is not None]


class GradientBuckets:
    """The buckets of one DistributedOptimizer and their state within the current step.

    `start(wire, communicator, prescale)` and `scale()` come from the optimizer: the wire dtype
    for a gradient dtype (compression), the ring to reduce on, and the factors of the average."""

    def __init__(self, params: list[torch.Tensor], threshold_bytes: int, passes_per_step: int,
                 wire_dtype: Callable[[torch.dtype], torch.dtype], communicator: Callable[[], Any],
                 prescale: Callable[[], float], postscale: Callable[[], float],
                 spans: SpanRecorder | None = None,
                 sparse: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None) -> None:
        """`spans`: the worker's timeline; with it on, each step is told as forward (from
        `forward_from_us`, which the optimizer sets), backward, one span per bucket's allreduce.
        `sparse` reduces a step's sparse gradients as sparse tensors (at `synchronize()`, after
        the buckets); without it they travel dense in their bucket and are made sparse again."""
        self.spans = spans or SpanRecorder()
        self.forward_from_us = 0
        self._first_grad_us = 0
        self._last_grad_us = 0
        self._params = params
        self._index = {id(p): i for i, p in enumerate(params)}
        self._threshold = threshold_bytes
        self.buckets: list[_Bucket] = []
        self._bucket_of: dict[int, _Bucket] = {}
        self._plan(None)
        self._observed: list[int] = []  # this step's gradients (indices into params) in the order they became ready
        self._layout_for: int | None = None  # the generation the layout in use belongs to
        self._agreed = False  # whether this generation's ranks agreed on the layout (after its first step)
        self._step_open = False
        self._passes: dict[int, int] = {}
        self.passes_per_step = passes_per_step
        #: Exact sums (a declared global batch's): each pass's gradient is added into a float64
        #: accumulator and taken out of `.grad`, the ring sums the accumulators in float64, and the
        #: result is rounded to the parameter's dtype once. Sums of float32 values are exact in
        #: float64 (short of a 2^29 spread of magnitudes), so the bits do not depend on how many
        #: ranks shared the micro-batches, nor on the order the ring added them.
        self.exact = False
        self._accumulated: dict[int, torch.Tensor] = {}
        self._fresh: set[int] = set()  # parameters whose accumulator holds this step's sum
        self._scratch: torch.Tensor | None = None  # (float64 values of one chunk of a gradient, `_add_widened`)
        self._wire_dtype = wire_dtype
        self._communicator = communicator
        self._sparse = sparse
        self._prescale = prescale
        self._postscale = postscale
        self._next = 0  # the first bucket not started yet: buckets start in order
        self._generation: int | None = None  # the ring this step's buckets went out on
        take_over(params, self)
        self._handles = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]

    # ------------------------------------------------------------ the layout
    def _plan(self, order: list[int] | None) -> None:
        """Buckets for `order` (indices into the parameters, the order their gradients become
        ready), or for the reverse order of the parameters (None)."""
        ordered = [self._params[i] for i in order] if order is not None else list(reversed(self._params))
        self.buckets = [_Bucket(group) for group in plan_buckets_in_order(ordered, self._threshold)]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}

    @property
    def order(self) -> list[int]:
        """The layout in use: parameter indices in bucket order."""
        return [self._index[id(p)] for b in self.buckets for p in b.params]

    def _open_step(self) -> None:
        """At a step's first gradient (or its synchronize): on a new ring every rank starts from
        the reverse-parameter layout, whatever it agreed on before, as newcomers do."""
        if self._step_open:
            return
        self._step_open = True
        generation = self._communicator().generation
        if generation != self._layout_for:
            if self._agreed:
                self._plan(None)
            self._layout_for, self._agreed = generation, False

    def _agree(self) -> None:
        """After a generation's first step: take rank 0's observed gradient order (broadcast, so
        every rank plans alike) and rebuild the buckets in it, as DDP rebuilds its buckets after
        its first iteration. A model whose modules run in another order than they are declared
        then still sends its first-ready gradients first."""
        comm = self._communicator()
        if comm.generation != self._layout_for:
            return  # a new ring already: its first step agrees
        seen = dict.fromkeys(self._observed)
        proposal = list(seen) + [i for i in reversed(range(len(self._params))) if i not in seen]
        agreed = comm.broadcast_(torch.tensor(proposal, dtype=torch.int64), root_rank=0).tolist()
        if sorted(agreed) != list(range(len(self._params))):
            raise ValueError(f"rank 0's gradient order is not an order of this model's {len(self._params)} "
                                       f"parameters: every rank must wrap the same parameters in DistributedOptimizer")
        if agreed != self.order:
            self._plan(agreed)
        self._agreed = True

    # ------------------------------------------------------------ during backward
    def _grad_ready(self, param: torch.Tensor) -> None:
        if self._generation is not None and self._communicator().generation != self._generation:
            self._reset()  # a reset happened mid-step (another collective failed): start over
        self._open_step()
        if self.spans.on:
            self._last_grad_us = now_us()
            self._first_grad_us = self._first_grad_us or self._last_grad_us
        bucket = self._bucket_of[id(param)]
        passes = self._passes.get(id(param), 0) + 1
        self._passes[id(param)] = passes
        if passes > self.passes_per_step:
            raise RuntimeError(
                f"gradients were computed {passes} times before step() but backward_passes_per_step is "
                f"{self.passes_per_step}: pass backward_passes_per_step={passes} to accumulate them locally"
            )
        if self.exact:
            self._accumulate(param)
        if passes != self.passes_per_step:
            return  # accumulating locally: only the k-th backward pass communicates
        if not self._agreed:
            self._observed.append(self._index[id(param)])
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._start_ready()

    def _accumulate(self, param: torch.Tensor) -> None:
        """Exact sums: add this pass's gradient into the parameter's float64 accumulator (its
        first pass of a step copies it) and zero `.grad` for the next pass."""
        grad = param.grad
        if grad is None:
            return
        if grad.is_sparse:
            raise ValueError("a global batch's exact sums need dense gradients: pass exact=False to the ElasticSampler "
                             "(or sparse=False to the embedding)")
        acc = self._accumulated.get(id(param))
        if acc is None or acc.shape != grad.shape or acc.device != grad.device:
            acc = self._accumulated[id(param)] = torch.empty_like(grad, dtype=torch.float64)
            self._fresh.discard(id(param))
        with torch.no_grad():
            if id(param) in self._fresh:
                self._add_widened(acc, grad)
            else:
                acc.copy_(grad)
                self._fresh.add(id(param))
            grad.zero_()  # (the next pass accumulates into it: 0 + g is g exactly, and no memory is allocated)

    def _add_widened(self, acc: torch.Tensor, grad: torch.Tensor) -> None:
        """acc += grad, `grad` of a narrower dtype: on the CPU through a float64 scratch a chunk at
        a time (torch's add with type promotion is not vectorized there: 1.6 ms for 1.3 M values,
        0.7 ms this way)."""
        if acc.device.type != "cpu" or grad.dtype == acc.dtype:
            acc.add_(grad)
            return
        flat_grad, flat_acc = grad.reshape(-1), acc.view(-1)
        total = flat_grad.numel()
        if self._scratch is None or self._scratch.numel() < min(total, _WIDEN_CHUNK):
            self._scratch = torch.empty(min(max(total, 1), _WIDEN_CHUNK), dtype=acc.dtype)
        for first in range(0, total, _WIDEN_CHUNK):
            count = min(_WIDEN_CHUNK, total - first)
            widened = self._scratch[:count]
            widened.copy_(flat_grad[first:first + count])
            flat_acc[first:first + count].add_(widened)

    def _start_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].ready == len(self.buckets[self._next].params):
            self._start(self.buckets[self._next])
            self._next += 1

    def _start(self, bucket: _Bucket) -> None:
        try:
            grads, dense = [], []
            for p in bucket.params:
                if self.exact:  # this step's float64 sum (zeros where unused, or on a rank given nothing)
                    acc = self._accumulated.get(id(p))
                    if acc is None:
                        acc = self._accumulated[id(p)] = torch.zeros_like(p, dtype=torch.float64)
                    elif id(p) not in self._fresh:
                        acc.zero_()
                    grads.append(acc)
                    dense.append(p)
                    continue
                if p.grad is None:  # unused this step: zeros, as Horovod reduces them
                    p.grad = torch.zeros_like(p)
                elif p.grad.is_sparse:
                    if self._sparse is not None:  # reduced as sparse at synchronize() (every rank's model alike)
                        bucket.sparse.append(p)
                        continue
                    bucket.resparsify.append(p)
                    p.grad = p.grad.to_dense()
                grads.append(p.grad)
                dense.append(p)
            comm = self._communicator()
            self._generation = comm.generation
            bucket.grads = grads
            if not grads:  # only sparse gradients: nothing for the wire
                return
            bucket.carriers = dense
            wire_dtype = torch.float64 if self.exact else self._wire_dtype(grads[0].dtype)
            carried = tuple(id(p) for p in dense)
            if bucket.wire is None or bucket.wire.dtype != wire_dtype or bucket.dense != carried:
                bucket.wire = torch.empty(sum(p.numel() for p in dense), dtype=wire_dtype, device=grads[0].device)
                bucket.views = list(flat.views(bucket.wire, dense))
                bucket.dense = carried
            flat.pack_scaled(grads, bucket.views, self._prescale())
            started = now_us() if self.spans.on else 0
            bucket.pending = comm.allreduce_async_(bucket.wire)
            if started:
                self._tell_completion(bucket.pending, started)
        except HorovodInternalError:
            self.clear()
            raise

    def _tell_completion(self, pending: Pending, started_us: int) -> None:
        """A span for a bucket's allreduce, ended when Gloo completes it (its future's callback
        runs on Gloo's thread: it only takes the time)."""
        index, spans = self._next, self.spans
        if pending.future is None:  # a ring of one: nothing travels
            spans.add(pb.SPAN_ALLREDUCE, started_us, now_us(), index)
            return
        pending.future.add_done_callback(lambda _: spans.add(pb.SPAN_ALLREDUCE, started_us, now_us(), index))

    def _tell_step(self) -> None:
        """Forward and backward of the step whose gradients are now all in."""
        if self._first_grad_us:
            if self.forward_from_us and self.forward_from_us < self._first_grad_us:
                self.spans.add(pb.SPAN_FORWARD, self.forward_from_us, self._first_grad_us)
            self.spans.add(pb.SPAN_BACKWARD, self._first_grad_us, self._last_grad_us)
        self._first_grad_us = self._last_grad_us = self.forward_from_us = 0

    # ------------------------------------------------------------ at step()
    def synchronize(self) -> None:
        """Start what is left, wait for every bucket in order, write the results back."""
        if self.spans.on:
            self._tell_step()
        try:
            self._open_step()
            for bucket in self.buckets[self._next:]:
                bucket.ready = len(bucket.params)
            self._start_ready()
            postscale = self._postscale()
            for bucket in self.buckets:
                if not bucket.grads:
                    continue
                assert bucket.pending is not None and bucket.wire is not None
                bucket.pending.wait()
                flat.unpack(bucket.wire, bucket.grads, postscale)
                if self.exact:  # rounded to the parameters' dtype once, from the same float64 bits on every rank
                    for p, summed in zip(bucket.carriers, bucket.grads):
                        p.grad = summed.to(p.dtype)
                for p, grad in zip(bucket.resparsify, bucket.resparsify_grads()):
                    p.grad = grad.to_sparse()
            sparse = [p for bucket in self.buckets for p in bucket.sparse]
            if sparse and self._sparse is not None:
                grads = [p.grad for p in sparse if p.grad is not None]
                for p, reduced in zip(sparse, self._sparse(grads)):
                    p.grad = reduced
            if not self._agreed:
                self._agree()
        except HorovodInternalError:
            self.clear()
            raise
        self._reset()

    def clear(self) -> None:
        """A collective failed: forget the step and its gradients (after the rollback the
        script computes them again), so nothing half-reduced can be applied."""
        for bucket in self.buckets:
            for p in bucket.params:
                p.grad = None
        self._reset()

    def _reset(self) -> None:
        self._step_open = False
        self._observed.clear()
        self._passes.clear()
        self._fresh.clear()
        self._next = 0
        self._generation = None
        for bucket in self.buckets:
            bucket.ready, bucket.pending, bucket.grads = 0, None, []
            bucket.sparse, bucket.resparsify = [], []

    @property
    def in_flight(self) -> int:
        """Buckets started and not yet written back."""
        return sum(1 for b in self.buckets if b.pending is not None)

    def remove(self) -> None:
        """Stop hearing gradients (another DistributedOptimizer took the parameters): from here
        on every bucket goes out at `synchronize()`."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
