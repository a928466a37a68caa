"""Horovod's collectives on the current generation's ring: each is bounded, so a dead or hung
peer raises `HorovodInternalError` instead of hanging. `ringmaster.torch` re-exports them."""

from __future__ import annotations

import io
from typing import Any, Iterable, Mapping

import torch

from ringmaster.torch import adasum
from ringmaster.torch.basics import _OPS, Adasum, Average, Sum, context
from ringmaster.torch.compression import Compression
from ringmaster.torch.result_pool import ResultPool
from ringmaster.worker.train import flat

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


#: Memory for new results of 8 MB and more, reused once the caller dropped them (fresh memory's
#: page faults would cost more than the reduction).
_results = ResultPool()


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
              compression: Any = Compression.none, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce `tensor` across all workers and return the result (the input is left alone)."""
    op = _resolve_op(op, average)
    if compression is Compression.none and op in (Average, Sum) and tensor.is_floating_point():
        # Summed straight from the input into the result (`Communicator.sum_into_async_`: no copy
        # first for a large tensor). As in Horovod, the average's 1/n and the postscale apply
        # after the sum, a prescale before it (a half-precision sum may need it to stay in range).
        comm = context().communicator()
        source = tensor.detach()
        if prescale_factor != 1.0:
            source = source * prescale_factor
        out = _results.empty_like(source)  # a large result reuses a buffer nobody holds any more
        comm.sum_into_async_(source, out, postscale_factor / (comm.size if op == Average else 1)).wait()
        return out
    compressed, ctx = compression.compress(tensor.detach().clone())
    allreduce_(compressed, average, name, op, prescale_factor, postscale_factor)
    return compression.decompress(compressed, ctx)


def grouped_allreduce_(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reduce a list of tensors in place as one group (Horovod's `grouped_allreduce_`): one flat
    buffer per device and dtype, one collective each, instead of one per tensor."""
    op = _resolve_op(op, average)
    for group in flat.by_kind(tensors):
        packed = flat.pack(group)
        allreduce_(packed, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)
        flat.unpack(packed, group)
    return tensors


def grouped_allreduce(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                      op: str | None = None, compression: Any = Compression.none, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """The reductions of a list of tensors, as new tensors (the inputs are left alone)."""
    outputs = [t.detach().clone() for t in tensors]
    if compression is not Compression.none:
        return [allreduce(t, average, name, op, compression, prescale_factor, postscale_factor) for t in tensors]
    return grouped_allreduce_(outputs, average, name, op, prescale_factor, postscale_factor)


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
    for group in flat.by_kind(tensors):
        packed = flat.pack(group)
        comm.broadcast_(packed, root_rank)
        flat.unpack(packed, group)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Give every worker `root_rank`'s optimizer state and hyperparameters."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if context().communicator().rank != root_rank:
        optimizer.load_state_dict(state)
