"""Horovod's PyTorch API on Ringmaster: `import ringmaster.torch as hvd`.

A Horovod elastic script runs with only its import line changed. Collectives go through
`torch.distributed` (Gloo on CPU, NCCL on GPU) on the ring of the current generation; each is
bounded, so a dead or hung peer raises `HorovodInternalError` instead of hanging.
"""

from __future__ import annotations

if __name__ != "ringmaster.torch":  # pragma: no cover - a wrong import path, caught at once
    raise ImportError(f"the training API is `ringmaster.torch` (import ringmaster.torch as hvd), not {__name__}")

import atexit
import io
from typing import Any, Iterable, Mapping

import torch
import torch.distributed as dist

from ringmaster.worker.train.context import WorkerContext
from ringmaster.worker.train.errors import HorovodInternalError, HostsUpdatedInterrupt, WorkersFailedError
from ringmaster.torch import adasum
from ringmaster.torch.compression import Compression
from ringmaster.torch.optimizer import DistributedOptimizer

# Reduction ops, as Horovod names them.
Average = "average"
Sum = "sum"
Min = "min"
Max = "max"
Adasum = "adasum"  # see ringmaster.torch.adasum
_OPS = {Sum: dist.ReduceOp.SUM, Average: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX, Adasum: None}

_context: WorkerContext | None = None


def init() -> None:
    """Join the job (idempotent). Outside `ringmaster run` this is a job of one worker."""
    global _context
    if _context is None:
        context = WorkerContext()
        context.init()
        _context = context
        atexit.register(shutdown)  # leave before the interpreter finalizes: see WorkerContext.shutdown


def shutdown() -> None:
    """Leave the job's rings and the rendezvous (also done at interpreter exit)."""
    global _context
    if _context is not None:
        _context.shutdown()
        _context = None
        atexit.unregister(shutdown)


def is_initialized() -> bool:
    """Has `hvd.init()` run (and `hvd.shutdown()` not since)?"""
    return _context is not None


def context() -> WorkerContext:
    """This worker's Ringmaster context (ring, rendezvous link); ValueError before `hvd.init()`."""
    if _context is None:
        raise ValueError("Ringmaster has not been initialized; call hvd.init() first")
    return _context


def rank() -> int:
    """This worker's rank in the current generation (0 .. size()-1); it can change at a reset."""
    return context().topology()[0]


def size() -> int:
    """The number of workers in the current generation; it changes when the job grows or shrinks."""
    return context().topology()[1]


def local_rank() -> int:
    """This worker's rank among the workers on its host (use it to pick a GPU)."""
    return context().topology()[2]


def local_size() -> int:
    """The number of workers on this worker's host in the current generation."""
    return context().topology()[3]


def cross_rank() -> int:
    """The rank of this worker's host among the hosts that have a worker with its local rank."""
    return context().topology()[4]


def cross_size() -> int:
    """The number of hosts that have a worker with this worker's local rank."""
    return context().topology()[5]


def is_homogeneous() -> bool:
    """Horovod's question; True: every host runs as many workers as its slots allow."""
    return True


def gloo_enabled() -> bool:
    """True: CPU tensors always go over Gloo rings."""
    return True


def nccl_built() -> bool:
    """True when CUDA is available: CUDA tensors then go over NCCL rings."""
    return torch.cuda.is_available()


# ---------------------------------------------------------------- collectives
def _resolve_op(op: str | None, average: bool | None) -> str:
    if op is None:
        return Sum if average is False else Average
    if op not in _OPS:
        raise ValueError(f"unknown reduction op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Adasum")
    return op


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce `tensor` across all workers in place."""
    comm = context().communicator()
    op = _resolve_op(op, average)
    if prescale_factor != 1.0:
        tensor.mul_(prescale_factor)
    if op == Adasum:
        if not tensor.is_floating_point():
            raise ValueError(f"hvd.Adasum reduces floating-point tensors, got {tensor.dtype}; use hvd.Sum or hvd.Average")
        flat = tensor.reshape(-1)
        tensor.copy_(adasum.reduce_slices(comm.allgather(flat.contiguous()), [flat.numel()]).view_as(tensor))
    else:
        comm.allreduce_(tensor, _OPS[op])
    scale = postscale_factor / comm.size if op == Average else postscale_factor
    if scale != 1.0:
        if tensor.is_floating_point():
            tensor.mul_(scale)
        else:
            tensor.copy_(torch.div(tensor, comm.size, rounding_mode="floor") if op == Average else tensor * scale)
    return tensor


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
              compression: Any = Compression.none, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce `tensor` across all workers and return the result (the input is left alone)."""
    op = _resolve_op(op, average)
    if compression is Compression.none and op in (Average, Sum) and tensor.is_floating_point():
        # The copy the result needs is made with every scale folded in (one pass), then summed
        # in place: no second pass to average, as `all_reduce` on a tensor of one's own.
        size = context().communicator().size
        scale = prescale_factor * postscale_factor / (size if op == Average else 1)
        out = torch.mul(tensor.detach(), scale) if scale != 1.0 else tensor.detach().clone()
        return allreduce_(out, op=Sum)
    compressed, ctx = compression.compress(tensor.detach().clone())
    allreduce_(compressed, average, name, op, prescale_factor, postscale_factor)
    return compression.decompress(compressed, ctx)


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Concatenate every worker's `tensor` along dimension 0 (first dimensions may differ)."""
    comm = context().communicator()
    tensor = tensor.detach()
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
    lengths = comm.allgather(torch.tensor([tensor.shape[0]], dtype=torch.int64))
    longest = int(max(int(n) for n in lengths))
    padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[: tensor.shape[0]] = tensor
    parts = comm.allgather(padded)
    return torch.cat([part[: int(n)] for part, n in zip(parts, lengths)])


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Overwrite `tensor` in place with `root_rank`'s value; returns it."""
    context().communicator().broadcast_(tensor, root_rank)
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """`root_rank`'s value of `tensor`, as a new tensor (the input is left alone)."""
    return broadcast_(tensor.detach().clone(), root_rank, name)


def barrier() -> None:
    """Wait until every worker of the generation reaches this call (bounded like every collective)."""
    context().communicator().barrier()


def join() -> int:
    """Horovod's join for uneven inputs is not needed here; this is a barrier returning rank 0."""
    barrier()
    return 0


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """Send a Python object from `root_rank` to every worker (torch.save format, in the ring)."""
    comm = context().communicator()
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


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int) -> None:
    """Overwrite parameters (a state_dict or named_parameters) with `root_rank`'s, in place.

    Tensors are sent as one flat buffer per dtype, not one collective each.
    """
    items = sorted(params.items()) if isinstance(params, Mapping) else list(params)
    tensors = [t for _, t in items if isinstance(t, torch.Tensor)]
    comm = context().communicator()
    if comm.size == 1 or not tensors:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        comm.broadcast_(flat, root_rank)
        offset = 0
        with torch.no_grad():
            for t in group:
                n = t.numel()
                t.copy_(flat[offset: offset + n].view_as(t))
                offset += n


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Give every worker `root_rank`'s optimizer state and hyperparameters."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if context().communicator().rank != root_rank:
        optimizer.load_state_dict(state)


from ringmaster.torch import elastic  # noqa: E402  (needs the functions above)

__all__ = [
    "Average", "Sum", "Min", "Max", "Adasum", "Compression", "DistributedOptimizer", "HorovodInternalError",
    "HostsUpdatedInterrupt", "WorkersFailedError", "allgather", "allgather_object", "allreduce", "allreduce_",
    "barrier", "broadcast", "broadcast_", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "cross_rank", "cross_size", "elastic", "init", "is_initialized", "join", "local_rank", "local_size", "rank",
    "shutdown", "size",
]
