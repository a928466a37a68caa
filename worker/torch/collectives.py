"""Horovod's collectives on the current generation's ring, with Horovod's signatures: each is
queued on its ring's `OpQueue` (run in order by a background thread, after the ranks agreed on
it, fused with its neighbours where it can be) and bounded, so a dead or hung peer raises
`HorovodInternalError` instead of hanging. The `*_async` forms return a handle for `poll` and
`synchronize`; the others wait, and (as in Horovod) carry gradients through autograd.
`ringmaster.torch` re-exports them."""

from __future__ import annotations

import io
import itertools
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from ringmaster.torch import operations as ops
from ringmaster.torch.basics import context, rank
from ringmaster.torch.compression import Compression
from ringmaster.torch.process_sets import ProcessSet, global_process_set, ring_of, root_in
from ringmaster.worker.train import flat
from ringmaster.worker.train.op_queue import Operation

# ------------------------------------------------------------------ handles
_handles: dict[int, Operation | Callable[[], Any]] = {}
_names: dict[str, tuple[Operation, Any]] = {}  # the names of operations in flight, with their rings (Horovod
# refuses a duplicate)
_handles_lock = threading.Lock()
_counter = itertools.count(1)


_waiting = threading.local()  # set while a synchronous call issues its operation (see _now)


def _now(issue: Callable[..., int], *args: Any) -> Any:
    """Issue an operation and wait for it: run on the caller's thread when its ring's queue is
    idle (no hand-over to the queue's thread), queued behind the others otherwise."""
    _waiting.now = True
    try:
        handle = issue(*args)
    finally:
        _waiting.now = False
    return synchronize(handle)


def _submit(process_set: ProcessSet | None, build: Callable[[Any], Operation], name: str | None) -> int:
    """Queue the operation `build(ring)` on the process set's ring; its handle."""
    comm = ring_of(process_set)
    operation = build(comm)
    with _handles_lock:
        if name is not None:
            if not isinstance(name, str):
                raise ValueError(f"name={name!r}: give a string")
            earlier = _names.get(name)
            if earlier is not None and _outstanding(*earlier):
                raise ValueError(f"a collective named {name!r} is still in flight: names of outstanding operations "
                                 "must be unique (synchronize the first, or give another name)")
            _names[name] = (operation, comm)
        handle = next(_counter)
        _handles[handle] = operation
    if getattr(_waiting, "now", False):
        comm.ops.run_here(operation)
    else:
        comm.ops.submit(operation)
    return handle


def _outstanding(operation: Operation, comm: Any) -> bool:
    """Does `operation` still hold its name? From its call until its handle is synchronized (or
    `poll` saw it done), unless it failed or its ring is gone (a reset: its handle will never be
    synchronized). Horovod frees a name when its operation completes, which makes its duplicate
    check depend on how fast the ring is; this is the same on every rank whatever the timing."""
    if not operation.done.is_set():
        return True
    return operation.error is None and comm.ops.usable


def forget_handles() -> None:
    """`hvd.shutdown()`: handles and the names they hold are gone, as Horovod's are."""
    with _handles_lock:
        _handles.clear()
        _names.clear()


def poll(handle: int) -> bool:
    """Has the operation of `handle` finished? (`synchronize` then returns without waiting.)"""
    with _handles_lock:
        operation = _handles.get(handle)
    if operation is None:
        raise ValueError(f"handle {handle!r} is not an operation in flight (synchronized already, or never issued)")
    if callable(operation) and not isinstance(operation, Operation):
        return True
    done = operation.done.is_set()
    if done:
        _release_name(operation)
    return done


def _release_name(operation: Operation) -> None:
    """A done operation's name is free again (it was synchronized, or polled done)."""
    with _handles_lock:
        name = operation.descriptor.name
        if name is not None and name in _names and _names[name][0] is operation:
            del _names[name]


def synchronize(handle: int | Callable[[], Any]) -> Any:
    """Wait for the operation of `handle` and return its output (a tuple for alltoall with splits).
    A peer that died or hung meanwhile raises `HorovodInternalError` (bounded by
    --collective-timeout); so does a generation that ended before the operation ran."""
    if callable(handle) and not isinstance(handle, int):  # sparse_allreduce_async's handle, as in Horovod
        return handle()
    with _handles_lock:
        operation = _handles.pop(handle, None)
    if operation is None:
        return None
    try:
        if not isinstance(operation, Operation):
            return operation()
        return operation.outcome()
    finally:
        if isinstance(operation, Operation):
            _release_name(operation)


# ------------------------------------------------------------------ allreduce
def _scales(prescale_factor: float, postscale_factor: float) -> tuple[float, float]:
    try:
        return float(prescale_factor), float(postscale_factor)
    except (TypeError, ValueError):
        raise ValueError(f"prescale_factor {prescale_factor!r} and postscale_factor {postscale_factor!r}: give "
                         "numbers") from None


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start reducing `tensor` into a new tensor; a handle for `synchronize`."""
    op = ops.resolve_op(op, average)
    pre, post = _scales(prescale_factor, postscale_factor)
    output = ops.RESULTS.empty_like(tensor.detach())  # a large result reuses a buffer nobody holds any more
    return _submit(process_set, lambda comm: ops.allreduce(tensor.detach(), output, op, pre, post, name), name)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start reducing `tensor` in place; a handle for `synchronize`."""
    op = ops.resolve_op(op, average)
    pre, post = _scales(prescale_factor, postscale_factor)
    return _submit(process_set, lambda comm: ops.allreduce(tensor.data, tensor.data, op, pre, post, name), name)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce `tensor` across the workers in place."""
    _now(allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    return tensor


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale, postscale, process_set):  # type: ignore[override]
        ctx.args = (average, op, prescale, postscale, process_set)
        return _now(allreduce_async, tensor, average, name, op, prescale, postscale, process_set)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        average, op, prescale, postscale, process_set = ctx.args
        return (allreduce(grad, average, None, Compression.none, op, prescale, postscale, process_set),
                None, None, None, None, None, None)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = Compression.none, op: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce `tensor` across the workers and return the result (the input is left alone);
    gradients flow back through an allreduce, as in Horovod."""
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors as one group (one buffer per device and dtype)."""
    op = ops.resolve_op(op, average)
    pre, post = _scales(prescale_factor, postscale_factor)
    inputs = [t.detach() for t in tensors]
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in inputs]
    return _submit(process_set, lambda comm: ops.grouped_allreduce(inputs, outputs, op, pre, post, name), name)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors in place as one group."""
    op = ops.resolve_op(op, average)
    pre, post = _scales(prescale_factor, postscale_factor)
    inputs = [t.data for t in tensors]
    return _submit(process_set, lambda comm: ops.grouped_allreduce(inputs, inputs, op, pre, post, name), name)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce a list of tensors in place as one group (Horovod's `grouped_allreduce_`)."""
    _now(grouped_allreduce_async_, tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    return list(tensors)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale, postscale, process_set, *tensors):  # type: ignore[override]
        ctx.args = (average, op, prescale, postscale, process_set)
        return tuple(_now(grouped_allreduce_async, list(tensors), average, name, op, prescale, postscale,
                                                         process_set))

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        average, op, prescale, postscale, process_set = ctx.args
        reduced = grouped_allreduce(list(grads), average=average, op=op, prescale_factor=prescale,
                                    postscale_factor=postscale, process_set=process_set)
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      op: str | None = None, compression: Any = Compression.none, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """The reductions of a list of tensors, as new tensors (the inputs are left alone)."""
    compressed = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set,
                                      *[c for c, _ in compressed])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: str, process_set: ProcessSet = global_process_set):
    """Reduce a sparse tensor by gathering its indices and values (Horovod's way); the handle is
    a function that `synchronize` calls."""
    op = ops.resolve_op(op, None)
    if op not in (ops.Sum, ops.Average):
        raise ValueError(f"sparse_allreduce_async reduces with hvd.Sum or hvd.Average, not {op!r}")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices = allgather_async(t._indices().transpose(0, 1).contiguous(), name=f"{name}.indices",
                              process_set=process_set)
    values = allgather_async(t._values(), name=f"{name}.values", process_set=process_set)

    def handle() -> torch.Tensor:
        gathered_values = synchronize(values)
        gathered_indices = synchronize(indices)
        if op == ops.Average:
            gathered_values = gathered_values / ring_of(process_set).size
        if gathered_indices.dim() == 0 or gathered_values.dim() == 0:
            return t.new().resize_as_(t)
        # (the peers' indices are checked against the shape: an index past it would be a wild write)
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values, t.size(),
                                       check_invariants=True)

    return handle


# ------------------------------------------------------------------ allgather
def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every worker's `tensor` along dimension 0 (first dimensions may differ)."""
    return _submit(process_set, lambda comm: ops.allgather(tensor, name), name)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):  # type: ignore[override]
        ctx.dim, ctx.process_set = (tensor.shape[0] if tensor.dim() else 1), process_set
        return _now(allgather_async, tensor, name, process_set)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        reduced = allreduce(grad, average=True, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.process_set)
        offset = int(dims[: ring_of(ctx.process_set).rank].sum())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every worker's `tensor` along dimension 0 (first dimensions may differ)."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an `allgather` of each tensor of a list, as one operation."""
    return _submit(process_set, lambda comm: ops.grouped_allgather(list(tensors), name), name)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):  # type: ignore[override]
        ctx.dims, ctx.process_set = [t.shape[0] if t.dim() else 1 for t in tensors], process_set
        return tuple(_now(grouped_allgather_async, list(tensors), name, process_set))

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        reduced = grouped_allreduce(list(grads), average=True, process_set=ctx.process_set)
        dims = allgather(torch.tensor(ctx.dims, dtype=torch.int64).reshape(1, -1), process_set=ctx.process_set)
        mine = ring_of(ctx.process_set).rank
        offsets = dims[:mine].sum(dim=0).tolist() if mine else [0] * len(ctx.dims)
        return (None, None, *[r.narrow(0, int(o), d) for r, o, d in zip(reduced, offsets, ctx.dims)])


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """`allgather` of each tensor of a list, issued as one operation."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# ------------------------------------------------------------------ broadcast
def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start copying `root_rank`'s `tensor` into a new tensor on every worker."""
    root = root_in(process_set, root_rank)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _submit(process_set, lambda comm: ops.broadcast(tensor.detach(), output, root, name), name)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start overwriting `tensor` in place with `root_rank`'s."""
    root = root_in(process_set, root_rank)
    return _submit(process_set, lambda comm: ops.broadcast(tensor.data, tensor.data, root, name), name)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite `tensor` in place with `root_rank`'s value; returns it."""
    _now(broadcast_async_, tensor, root_rank, name, process_set)
    return tensor


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):  # type: ignore[override]
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _now(broadcast_async, tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        reduced = allreduce(grad, average=True, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """`root_rank`'s value of `tensor`, as a new tensor (the input is left alone)."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


# ------------------------------------------------------------------ alltoall
def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start sending rows `splits[j]` of `tensor` to worker j (equal parts without splits);
    `synchronize` gives (the rows received, in rank order; how many came from each worker)."""
    return _submit(process_set, lambda comm: ops.alltoall(tensor.detach(), splits, comm.size, name), name)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):  # type: ignore[override]
        output, received = _now(alltoall_async, tensor, splits, name, process_set)
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, *unused):  # type: ignore[override]
        back, _ = alltoall(grad, splits=ctx.received, process_set=ctx.process_set)
        return back, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Rows `splits[j]` of `tensor` to worker j (equal parts without splits). Returns the rows
    received in rank order, and with `splits` also how many came from each worker (Horovod's)."""
    return _Alltoall.apply(tensor, splits, name, process_set)


# ------------------------------------------------------------------ reducescatter
def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: str = ops.Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start reducing `tensor` over the workers, each keeping its rows (the first `rows % size`
    workers one more, as in Horovod)."""
    op = ops.resolve_op(op, None)
    pre, post = _scales(prescale_factor, postscale_factor)
    return _submit(process_set, lambda comm: ops.reducescatter(tensor.detach(), op, pre, post, name), name)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):  # type: ignore[override]
        ctx.args = (op, process_set, prescale, postscale)
        return _now(reducescatter_async, tensor, name, op, process_set, prescale, postscale)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        op, process_set, prescale, postscale = ctx.args
        grad = grad * (ring_of(process_set).size if op == ops.Sum else 1) * prescale * postscale
        return allgather(grad, process_set=process_set), None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = Compression.none,
                  op: str = ops.Average, process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce `tensor` over the workers; each gets its rows of the result."""
    compressed, ctx = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None, op: str = ops.Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a `reducescatter` of each tensor of a list, as one operation."""
    op = ops.resolve_op(op, None)
    pre, post = _scales(prescale_factor, postscale_factor)
    inputs = [t.detach() for t in tensors]
    return _submit(process_set, lambda comm: ops.grouped_reducescatter(inputs, op, pre, post, name), name)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale, postscale, *tensors):  # type: ignore[override]
        ctx.args = (op, process_set, prescale, postscale)
        return tuple(_now(grouped_reducescatter_async, list(tensors), name, op, process_set, prescale,
                                                             postscale))

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        op, process_set, prescale, postscale = ctx.args
        factor = (ring_of(process_set).size if op == ops.Sum else 1) * prescale * postscale
        return (None, None, None, None, None, *grouped_allgather([g * factor for g in grads], process_set=process_set))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: Any = Compression.none, op: str = ops.Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """`reducescatter` of each tensor of a list, issued as one operation."""
    compressed = [compression.compress(t) for t in tensors]
    reduced = _GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                          *[c for c, _ in compressed])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


# ------------------------------------------------------------------ barrier, join
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every worker of the set reaches this call (bounded like every collective)."""
    _now(_submit, process_set, lambda comm: ops.barrier(), None)


def join(device: int = -1) -> int:
    """This worker has no more data (uneven inputs): until every worker has joined, the others'
    allreduces and barriers go on, this worker taking part with zeros (the reduction's identity),
    as in Horovod; returns the rank of the worker that joined last, the same on every worker.
    Other collectives issued while a worker has joined fail on every worker that issued them.
    `device` (Horovod's, for the GPU it used) is accepted and not needed."""
    return _now(_submit, global_process_set, lambda comm: ops.join(), None)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Send a Python object from `root_rank` to every worker of the set (torch.save format, in the ring)."""
    comm = ring_of(process_set)
    root_rank = root_in(process_set, root_rank)
    if comm.size == 1:
        return obj
    if comm.rank == root_rank:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    comm.broadcast_(length, root_rank)
    if comm.rank != root_rank:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    comm.broadcast_(payload, root_rank)
    if comm.rank == root_rank:
        return obj
    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Every worker's `obj`, in rank order (torch.save format, in the ring: only the job's own objects)."""
    comm = context().communicator()
    return [broadcast_object(obj if r == comm.rank else None, r) for r in range(comm.size)]


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                         root_rank: int) -> None:
    """Overwrite parameters (a state_dict or named_parameters) with `root_rank`'s, in place.

    Tensors are sent as one flat buffer per dtype, not one collective each.
    """
    items = sorted(params.items()) if isinstance(params, Mapping) else list(params)
    tensors = [t for _, t in items if isinstance(t, torch.Tensor)]
    comm = context().communicator()
    if comm.size == 1 or not tensors:
        return
    for group in flat.by_kind(tensors):
        packed = flat.pack(group)
        comm.broadcast_(packed, root_rank)
        flat.unpack(packed, group)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    """Give every worker `root_rank`'s optimizer state and hyperparameters. An optimizer that
    has no state yet gets it first as Horovod gives it: every parameter that takes a gradient
    gets a zero one and the wrapped optimizer takes one step on them (no reduction)."""
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer)
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if context().communicator().rank != root_rank:
        optimizer.load_state_dict(state)


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Horovod's way of giving an optimizer its state before the first broadcast: zero
    gradients (sparse for SparseAdam) and one step of the optimizer itself, not of a
    DistributedOptimizer around it (that step would reduce, and only this worker takes it)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    getattr(optimizer, "local_step", optimizer.step)()
