"""Horovod's collectives as queued operations (`op_queue.Operation`) with Horovod's semantics:
what is scaled when and how integers are scaled, how `reducescatter` splits an uneven first
dimension, what `alltoall` returns. Each builder checks what one rank can check alone (raising
`ValueError` at the call, as Horovod does) and returns the operation; `ringmaster.torch` queues
it on the ring of its process set. Nothing here knows about handles or the worker's context, so
the semantics are tested on real Gloo rings of threads.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ringmaster.torch import adasum
from ringmaster.torch.result_pool import ResultPool
from ringmaster.worker.train import gloo_types, ring_sum
from ringmaster.worker.train.exchange import byte_view
from ringmaster.worker.train.negotiation import Descriptor, Kind, Reduction
from ringmaster.worker.train.op_queue import FuseKey, Operation
from ringmaster.worker.train.speculation import Speculation

# Reduction ops, as Horovod names them (its `hvd.Average` and the rest are these strings).
Average = "average"
Sum = "sum"
Min = "min"
Max = "max"
Product = "product"
Adasum = "adasum"  # see ringmaster.torch.adasum
OPS: dict[str, Any] = {Sum: dist.ReduceOp.SUM, Average: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
                       Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT, Adasum: None}
_OP_CODES = {Sum: Reduction.SUM, Average: Reduction.AVERAGE, Min: Reduction.MIN, Max: Reduction.MAX,
             Product: Reduction.PRODUCT, Adasum: Reduction.ADASUM}
#: Memory for new results of 256 KB and more, reused once the caller dropped them (fresh memory's
#: page faults would cost more than the collective itself).
RESULTS = ResultPool()


def resolve_op(op: str | None, average: bool | None) -> str:
    """Horovod's `op=`, or its older `average=` flag (Average unless average=False)."""
    if op is None:
        return Sum if average is False else Average
    if op not in OPS:
        raise ValueError(f"unknown reduction op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product "
                         "or hvd.Adasum")
    if average is not None:
        raise ValueError("give either op= or the older average=, not both")
    return op


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply in place as Horovod does: floats by the factor; integers in double precision,
    truncated toward zero (Horovod's C++ cast), so `prescale_factor=0.5` on 3 gives 1."""
    if factor == 1.0:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    elif tensor.dtype == torch.bool:
        if factor == 0.0:
            tensor.zero_()
    else:
        tensor.copy_((tensor.to(torch.float64) * factor).trunc())


def postscale_(tensor: torch.Tensor, op: str, size: int, postscale: float) -> None:
    """The scaling after a reduction, in place: an average divides by the ring's size (a true
    division for floating point, so the average of equal tensors is each of them exactly, as
    Horovod's tests require; integers as Horovod scales them, truncated), then `postscale`."""
    if op != Average:
        scale_(tensor, postscale)
    elif tensor.is_floating_point() or tensor.is_complex():
        if size != 1:
            tensor.div_(size)
        scale_(tensor, postscale)
    else:
        scale_(tensor, postscale / size)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`b` is `a`'s memory viewed alike (the in-place forms pass `tensor.data`, a new object each
    time): an in-place operation, which must not copy onto itself nor read what it is writing."""
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
                      and a.dtype == b.dtype and a.device == b.device)


def _bytes_of(tensor: torch.Tensor, budget: int) -> torch.Tensor | None:
    """`tensor`'s bytes (1-D uint8) to carry in a negotiation round, when it is on the CPU and
    they fit `budget`; None otherwise (the operation runs as a collective)."""
    if tensor.device.type != "cpu" or tensor.numel() * tensor.element_size() > budget:
        return None
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _from_bytes(payload: torch.Tensor, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    """A fresh tensor of `dtype` and `shape` from a rank's bytes (ValueError when they do not
    make one: a peer's message says otherwise than its row)."""
    expected = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
    if payload.numel() != expected:
        raise ValueError(f"a rank sent {payload.numel()} bytes for a {dtype} tensor of shape {tuple(shape)} "
                         f"({expected} bytes)")
    return payload.clone().view(dtype).reshape(tuple(shape))


def _to_peers(parts: Sequence[torch.Tensor], rank: int) -> list[torch.Tensor | None]:
    """Each part's bytes, by rank, with this rank's own left out (early data's sends or targets)."""
    return [None if r == rank else byte_view(p) for r, p in enumerate(parts)]


def _prescaled(tensor: torch.Tensor, prescale: float) -> torch.Tensor:
    """`tensor` as it is reduced: a scaled copy when `prescale` is not 1, else itself (contiguous)."""
    source = tensor.detach().clone() if prescale != 1.0 else tensor.detach().contiguous()
    scale_(source, prescale)
    return source


def _row_bytes(tensor: torch.Tensor) -> int:
    return int(torch.Size(tensor.shape[1:]).numel()) * tensor.element_size()


def _owned_as(payload: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A buffer of this rank's own (early bytes received) viewed as a tensor like `like`, without
    a copy (ValueError when its size is not `like`'s)."""
    expected = like.numel() * like.element_size()
    if payload is None or payload.numel() != expected:
        raise ValueError(f"a rank sent {0 if payload is None else payload.numel()} bytes for a {like.dtype} tensor of "
                         f"shape {tuple(like.shape)} ({expected} bytes)")
    return payload.view(like.dtype).reshape(like.shape)


def _rows_from(payload: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Whole rows of `like`'s dtype and row shape from a rank's early bytes (ValueError when they
    are not whole rows)."""
    if payload is None:
        raise ValueError("a rank sent nothing early where every rank said it did")
    row = _row_bytes(like)
    if payload.numel() % row:
        raise ValueError(f"a rank sent {payload.numel()} bytes, not whole rows of {row} bytes "
                         f"({like.dtype}, rows of shape {tuple(like.shape[1:])})")
    return _from_bytes(payload, like.dtype, (payload.numel() // row, *like.shape[1:]))


def _reduced_bytes(payloads: list[torch.Tensor], tensor: torch.Tensor, op: str, prescale: float) -> torch.Tensor:
    """Every rank's bytes of `tensor` (its dtype and shape) prescaled and reduced by `op` in rank
    order: the same sum on every rank (before any postscale), as a fresh tensor."""
    parts = [_from_bytes(p, tensor.dtype, tensor.shape) for p in payloads]
    for part in parts:
        scale_(part, prescale)
    return _reduce_parts(parts, op)


def _reduce_parts(parts: list[torch.Tensor], op: str) -> torch.Tensor:
    """Every rank's part reduced in rank order, into the first (the same result on every rank);
    dtypes torch cannot add (uint16, uint32, ...) in a wider one, cast back after."""
    wider = gloo_types.wider_dtype(parts[0].dtype)
    if wider is not None:
        return _reduce_parts([p.to(wider) for p in parts], op).to(parts[0].dtype)
    total = parts[0]
    for part in parts[1:]:
        if op in (Sum, Average):
            total.add_(part)
        elif op == Product:
            total.mul_(part)
        elif total.dtype == torch.bool:
            (torch.logical_and if op == Min else torch.logical_or)(total, part, out=total)
        else:
            (torch.minimum if op == Min else torch.maximum)(total, part, out=total)
    return total


def _check_tensor(tensor: Any, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what} takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_sparse:
        raise ValueError(f"{what} takes a dense tensor; reduce sparse gradients with sparse_allreduce_async "
                         "(DistributedOptimizer(sparse_as_dense=...) does it for you)")
    return tensor


def allreduce(tensor: torch.Tensor, output: torch.Tensor, op: str, prescale: float, postscale: float,
              name: str | None) -> Operation:
    """Reduce `tensor` into `output` (the same tensor for the in-place forms)."""
    _check_tensor(tensor, "allreduce")
    if op == Adasum and not tensor.is_floating_point():
        raise ValueError(f"hvd.Adasum reduces floating-point tensors, got {tensor.dtype}; use hvd.Sum or hvd.Average")
    if tensor.dtype == torch.bool and op in (Sum, Average, Product):
        raise ValueError(f"allreduce of a bool tensor with op {op!r}: use hvd.Min (and) or hvd.Max (or)")
    _check_complex(tensor, op, "allreduce")

    def start_reduce(comm: Any, buffer: torch.Tensor) -> Callable[[], None]:
        """Start reducing `buffer` in place; the wait that finishes it (the postscale)."""
        scale_(buffer, prescale)
        if op == Adasum:
            flat = buffer.reshape(-1)
            flat.copy_(adasum.reduce_slices(comm.allgather(flat.contiguous()), [flat.numel()]))
            scale_(buffer, postscale)
            return _done
        pending = comm.allreduce_async_(buffer, OPS[op])

        def wait() -> None:
            pending.wait()
            postscale_(buffer, op, comm.size, postscale)

        return wait

    in_place = _same_memory(tensor, output)

    def start(comm: Any) -> Callable[[], torch.Tensor]:
        if (not in_place and op in (Sum, Average) and prescale == 1.0 and tensor.is_floating_point()
                and output.is_contiguous() and tensor.is_contiguous() and ring_sum.takes_into(tensor, comm.size)):
            # Summed straight from the input into the result (no copy first for a large tensor; the
            # average's division folded into the sum as a scale, which may round the last bit apart).
            summing = comm.sum_into_async_(tensor.detach(), output, postscale / (comm.size if op == Average else 1))

            def summed() -> torch.Tensor:
                summing.wait()
                return output

            return summed
        if not in_place:
            output.copy_(tensor)
        buffer = output if output.is_contiguous() else output.contiguous()
        reduced = start_reduce(comm, buffer)

        def finished() -> torch.Tensor:
            reduced()
            if buffer is not output:
                output.copy_(buffer)
            return output

        return finished

    def complete(comm: Any, payloads: list[torch.Tensor]) -> torch.Tensor:
        total = _reduced_bytes(payloads, tensor, op, prescale)
        postscale_(total, op, comm.size, postscale)
        output.copy_(total)
        return output

    fuse = None if op == Adasum else FuseKey(tensor.dtype, tensor.device, op, prescale, postscale)
    return Operation(Descriptor(Kind.ALLREDUCE, (tensor,), _OP_CODES[op], name=name, prescale=prescale,
                                postscale=postscale), lambda comm: start(comm)(), fuse, (tensor,), (output,),
                     start_reduce, lambda: output, start,
                     inline=None if op == Adasum else lambda comm, budget: _bytes_of(tensor, budget),
                     complete=complete)


def _done() -> None:
    """The wait of something already finished."""


def grouped_allreduce(tensors: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], op: str, prescale: float,
                      postscale: float, name: str | None) -> Operation:
    """Reduce a list of tensors as one group (one buffer per device and dtype)."""
    if not tensors:
        raise ValueError("grouped_allreduce takes a non-empty list of tensors")
    parts = [allreduce(t, o, op, prescale, postscale, None) for t, o in zip(tensors, outputs)]

    def run(comm: Any) -> list[torch.Tensor]:
        groups: dict[tuple[torch.device, torch.dtype], list[Operation]] = {}
        for part in parts:
            groups.setdefault((part.inputs[0].device, part.inputs[0].dtype), []).append(part)
        for group in groups.values():
            if len(group) == 1 or group[0].reduce is None or op == Adasum:
                for part in group:
                    part.run(comm)
                continue
            packed = torch.cat([p.inputs[0].detach().reshape(-1) for p in group])
            group[0].reduce(comm, packed)()
            offset = 0
            for part in group:
                n = part.outputs[0].numel()
                part.outputs[0].copy_(packed[offset: offset + n].view_as(part.outputs[0]))
                offset += n
        return list(outputs)

    return Operation(Descriptor(Kind.GROUPED_ALLREDUCE, tuple(tensors), _OP_CODES[op], name=name, prescale=prescale,
                                postscale=postscale), run)


def _first_dims(comm: Any, tensors: Sequence[torch.Tensor]) -> list[list[int]]:
    """Every rank's first dimension of each tensor: [rank][tensor] (one small allgather)."""
    mine = torch.tensor([t.shape[0] for t in tensors], dtype=torch.int64)
    return [part.tolist() for part in comm.allgather(mine)]


def _gather_rows(comm: Any, tensor: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """Every rank's `tensor` (first dimension `dims[rank]`) one after another along dimension 0.
    On the CPU each peer's rows come straight into the output (`Communicator.exchange_async`);
    CUDA tensors go to NCCL's allgather, padded to the longest."""
    if not tensor.is_cuda:
        source = tensor.contiguous()
        out = RESULTS.empty((sum(dims), *tensor.shape[1:]), tensor.dtype, tensor.device)
        parts = list(out.split(dims))
        pending = comm.exchange_async([source] * comm.size, parts, "allgather")
        parts[comm.rank].copy_(source)  # (while the peers' rows are on the wire)
        pending.wait()
        return out
    longest = max(dims)
    if all(d == longest for d in dims):
        out = RESULTS.empty((comm.size * longest, *tensor.shape[1:]), tensor.dtype, tensor.device)
        comm.allgather_into_async(out, tensor.contiguous()).wait()
        return out
    padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[: tensor.shape[0]] = tensor
    out = torch.empty((comm.size * longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    comm.allgather_into_async(out, padded).wait()
    return torch.cat([out[r * longest: r * longest + d] for r, d in enumerate(dims)])


def _as_rows(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()


def allgather(tensor: torch.Tensor, name: str | None) -> Operation:
    """Every rank's tensor concatenated along dimension 0 (the first dimension may differ)."""
    rows = _as_rows(_check_tensor(tensor, "allgather"))

    def run(comm: Any) -> torch.Tensor:
        dims = operation.peer_dims if operation.peer_dims is not None else [d[0] for d in _first_dims(comm, [rows])]
        return _gather_rows(comm, rows, dims)

    def complete(comm: Any, payloads: list[torch.Tensor]) -> torch.Tensor:
        dims = operation.peer_dims or [rows.shape[0]] * comm.size
        return torch.cat([_from_bytes(p, rows.dtype, (d, *rows.shape[1:])) for p, d in zip(payloads, dims)])

    def speculate(comm: Any) -> Speculation | None:
        """Send this rank's rows to every peer; expect as many from each, straight into the output."""
        if rows.device.type != "cpu" or _row_bytes(rows) == 0:
            return None
        source, first = rows.contiguous(), rows.shape[0]
        out = RESULTS.empty((comm.size * first, *rows.shape[1:]), rows.dtype, rows.device)
        parts = [out[r * first: (r + 1) * first] for r in range(comm.size)]
        parts[comm.rank].copy_(source)
        mine = byte_view(source)

        targets = _to_peers(parts, comm.rank)

        def finish(payloads: list[torch.Tensor | None] | None) -> torch.Tensor:
            if payloads is None and all(d == first for d in operation.peer_dims or ()):
                return out
            got = payloads or targets
            return torch.cat([source if r == comm.rank else _rows_from(got[r], rows) for r in range(comm.size)])

        return Speculation([None if r == comm.rank else mine for r in range(comm.size)], targets, finish)

    operation = Operation(Descriptor(Kind.ALLGATHER, (rows,), name=name), run,
                          inline=lambda comm, budget: _bytes_of(rows, budget), complete=complete, speculate=speculate)
    return operation


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None) -> Operation:
    if not tensors:
        raise ValueError("grouped_allgather takes a non-empty list of tensors")
    rows = [_as_rows(_check_tensor(t, "grouped_allgather")) for t in tensors]

    def run(comm: Any) -> list[torch.Tensor]:
        dims = _first_dims(comm, rows)
        return [_gather_rows(comm, t, [d[i] for d in dims]) for i, t in enumerate(rows)]

    return Operation(Descriptor(Kind.GROUPED_ALLGATHER, tuple(rows), name=name), run)


def broadcast(tensor: torch.Tensor, output: torch.Tensor, root: int, name: str | None) -> Operation:
    """`root`'s tensor (a rank of the ring this runs on) into `output` on every rank."""
    _check_tensor(tensor, "broadcast")
    in_place = _same_memory(tensor, output)

    def start(comm: Any) -> Callable[[], torch.Tensor]:
        if not in_place:
            output.copy_(tensor)
        buffer = output if output.is_contiguous() else output.contiguous()
        pending = comm.broadcast_async_(buffer, root)

        def finished() -> torch.Tensor:
            pending.wait()
            if buffer is not output:
                output.copy_(buffer)
            return output

        return finished

    def inline(comm: Any, budget: int) -> torch.Tensor | None:
        carried = _bytes_of(tensor, budget)  # (every rank's tensor has the root's shape: the rows agree)
        return carried if carried is None or comm.rank == root else carried[:0]

    def complete(comm: Any, payloads: list[torch.Tensor]) -> torch.Tensor:
        output.copy_(_from_bytes(payloads[root], tensor.dtype, tensor.shape))
        return output

    return Operation(Descriptor(Kind.BROADCAST, (tensor,), root=root, name=name), lambda comm: start(comm)(),
                     start=start, inline=inline, complete=complete)


def _alltoall_sends(tensor: torch.Tensor, splits: Any, size: int) -> list[int]:
    """The rows this rank sends each rank: `splits` checked (ValueError names what is wrong), or
    equal parts without them."""
    if tensor.dim() == 0:
        raise ValueError("alltoall takes a tensor of at least one dimension (its rows are sent)")
    rows = tensor.shape[0]
    if splits is None:
        if rows % size:
            raise ValueError(f"alltoall without splits divides the first dimension equally, but {rows} rows do not "
                             f"divide among {size} workers; give splits=")
        return [rows // size] * size
    values = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
    if isinstance(splits, torch.Tensor) and splits.dim() > 1:
        raise ValueError("alltoall expects a 1-D splits tensor")
    if len(values) != size or any(not isinstance(v, int) or v < 0 for v in values):
        raise ValueError(f"alltoall splits {values}: give {size} non-negative whole numbers, one per worker "
                         f"in rank order")
    if sum(values) > rows:
        raise ValueError(f"alltoall splits sum to {sum(values)}, more than the tensor's {rows} rows")
    return [int(v) for v in values]


def alltoall(tensor: torch.Tensor, splits: Any, size: int, name: str | None) -> Operation:
    """Rows `splits[j]` of `tensor` to rank j (equal parts without splits); the result is
    (the rows received in rank order, how many came from each rank as an int32 tensor). The
    counts are on the device of a `splits` tensor, else on the CPU, as Horovod gives them."""
    _check_tensor(tensor, "alltoall")
    counts_device = splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")
    send = _alltoall_sends(tensor, splits, size)

    def run(comm: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if splits is None and operation.peer_dims is not None:  # equal parts: each rank's share of its rows
            received = torch.tensor([d // comm.size for d in operation.peer_dims], dtype=torch.int64)
        else:
            received = torch.empty(comm.size, dtype=torch.int64)
            comm.alltoall_async(received, torch.tensor(send, dtype=torch.int64), [1] * comm.size,
                                [1] * comm.size).wait()
        recv = [int(v) for v in received.tolist()]
        source = tensor.detach()[: sum(send)].contiguous()
        out = RESULTS.empty((sum(recv), *tensor.shape[1:]), tensor.dtype, tensor.device)
        if tensor.is_cuda:
            comm.alltoall_async(out, source, recv, send).wait()
        else:  # each peer's rows straight from and into place (`Communicator.exchange_async`)
            chunks, parts = list(source.split(send)), list(out.split(recv))
            pending = comm.exchange_async(chunks, parts, "alltoall")
            parts[comm.rank].copy_(chunks[comm.rank])  # (while the peers' rows are on the wire)
            pending.wait()
        return out, received.to(torch.int32).to(counts_device)

    row_shape = tuple(tensor.shape[1:])

    def inline(comm: Any, budget: int) -> torch.Tensor | None:
        counts = torch.tensor(send, dtype=torch.int64).view(torch.uint8)
        rows_sent = _bytes_of(tensor[: sum(send)], budget - counts.numel())
        return None if rows_sent is None else torch.cat([counts, rows_sent])

    def complete(comm: Any, payloads: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each rank's payload: its `send` counts (int64), then its rows in rank order."""
        head = 8 * comm.size
        parts, received = [], []
        for payload in payloads:
            counts = _from_bytes(payload[:head], torch.int64, (comm.size,)).tolist()
            if any(c < 0 for c in counts):
                raise ValueError(f"a rank sent negative alltoall counts {counts}")
            rows = _from_bytes(payload[head:], tensor.dtype, (sum(counts), *row_shape))
            first = sum(counts[: comm.rank])
            parts.append(rows[first: first + counts[comm.rank]])
            received.append(counts[comm.rank])
        return torch.cat(parts), torch.tensor(received, dtype=torch.int32, device=counts_device)

    def speculate(comm: Any) -> Speculation | None:
        """Send each peer its rows; expect from each as many as this rank sends it (equal parts
        without splits; a guess with them), straight into the output."""
        if tensor.device.type != "cpu" or _row_bytes(tensor) == 0:
            return None
        source = tensor.detach()[: sum(send)].contiguous()
        starts = [sum(send[:r]) for r in range(comm.size)]
        chunks = [source[start: start + count] for start, count in zip(starts, send)]
        out = RESULTS.empty((sum(send), *row_shape), tensor.dtype, tensor.device)
        parts = [out[start: start + count] for start, count in zip(starts, send)]
        parts[comm.rank].copy_(chunks[comm.rank])

        def finish(payloads: list[torch.Tensor | None] | None) -> tuple[torch.Tensor, torch.Tensor]:
            if payloads is None:
                return out, torch.tensor(send, dtype=torch.int32, device=counts_device)
            got = [chunks[r] if r == comm.rank else _rows_from(payloads[r], tensor) for r in range(comm.size)]
            return torch.cat(got), torch.tensor([g.shape[0] for g in got], dtype=torch.int32, device=counts_device)

        return Speculation(_to_peers(chunks, comm.rank),
                           _to_peers(parts, comm.rank), finish)

    operation = Operation(Descriptor(Kind.ALLTOALL, (tensor,), name=name), run, inline=inline, complete=complete,
                          speculate=speculate)
    return operation


def scatter_rows(rows: int, size: int, rank: int) -> int:
    """Rows of a reducescatter's result on `rank`: Horovod gives the first `rows % size` ranks one more."""
    return rows // size + (1 if rank < rows % size else 0)


def _reduce_scatter_one(comm: Any, tensor: torch.Tensor, op: str, prescale: float, postscale: float) -> torch.Tensor:
    source = _prescaled(tensor, prescale)
    rows, n = source.shape[0], comm.size
    tail = tuple(source.shape[1:])
    longest = rows // n + (1 if rows % n else 0)
    if rows % n == 0:
        out = RESULTS.empty((longest, *tail), source.dtype, source.device)
        comm.reduce_scatter_async(out, source, OPS[op]).wait()
    else:  # each rank's rows padded to the longest part, so the ring's equal parts fall on them
        padded = torch.zeros((n * longest, *tail), dtype=source.dtype, device=source.device)
        start = 0
        for r in range(n):
            count = scatter_rows(rows, n, r)
            padded[r * longest: r * longest + count] = source[start: start + count]
            start += count
        part = torch.empty((longest, *tail), dtype=source.dtype, device=source.device)
        comm.reduce_scatter_async(part, padded, OPS[op]).wait()
        out = part[: scatter_rows(rows, n, comm.rank)].clone()
    postscale_(out, op, n, postscale)
    return out


def _check_complex(tensor: torch.Tensor, op: str, what: str) -> None:
    if tensor.is_complex() and op not in (Sum, Average):
        raise ValueError(f"{what} of a {tensor.dtype} tensor with op {op!r}: a complex tensor can only be summed or "
                         "averaged (its min, max and product are not elementwise); use hvd.Sum or hvd.Average")


def _check_scatter_op(op: str, what: str) -> None:
    if op == Adasum:  # (NotImplementedError, a RuntimeError: what Horovod raises)
        raise NotImplementedError(f"{what} reduces with hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product, not "
                                  "hvd.Adasum")


def reducescatter(tensor: torch.Tensor, op: str, prescale: float, postscale: float, name: str | None) -> Operation:
    """Reduce `tensor` over the ranks and give each rank its rows (`scatter_rows`)."""
    _check_tensor(tensor, "reducescatter")
    _check_scatter_op(op, "reducescatter")
    _check_complex(tensor, op, "reducescatter")
    if tensor.dim() == 0:
        raise ValueError("reducescatter takes a tensor of at least one dimension (its rows are scattered)")

    def complete(comm: Any, payloads: list[torch.Tensor]) -> torch.Tensor:
        total = _reduced_bytes(payloads, tensor, op, prescale)
        rows, n = tensor.shape[0], comm.size
        first = sum(scatter_rows(rows, n, r) for r in range(comm.rank))
        out = total[first: first + scatter_rows(rows, n, comm.rank)].clone()
        postscale_(out, op, n, postscale)
        return out

    def speculate(comm: Any) -> Speculation | None:
        """Send each peer its rows of this rank's (prescaled) tensor; expect this rank's rows
        from each, into buffers of their own, reduced once all are in."""
        if tensor.device.type != "cpu" or _row_bytes(tensor) == 0:
            return None
        source = _prescaled(tensor, prescale)
        n, rows = comm.size, tensor.shape[0]
        counts = [scatter_rows(rows, n, r) for r in range(n)]
        starts = [sum(counts[:r]) for r in range(n)]
        chunks = [source[start: start + count] for start, count in zip(starts, counts)]
        mine = chunks[comm.rank]
        targets = [None if r == comm.rank else torch.empty(mine.numel() * mine.element_size(), dtype=torch.uint8)
                   for r in range(n)]

        def finish(payloads: list[torch.Tensor | None] | None) -> torch.Tensor:
            got = targets if payloads is None else payloads
            # The peers' bytes are in this rank's own buffers: reduced in place, in rank order,
            # into the first (this rank's rows are copied only when they come first).
            parts = [mine.clone() if r == comm.rank else _owned_as(b, mine) for r, b in enumerate(got)]
            out = _reduce_parts(parts, op)
            postscale_(out, op, n, postscale)
            return out

        return Speculation(_to_peers(chunks, comm.rank), targets, finish)

    return Operation(Descriptor(Kind.REDUCESCATTER, (tensor,), _OP_CODES[op], name=name, prescale=prescale,
                                postscale=postscale),
                     lambda comm: _reduce_scatter_one(comm, tensor, op, prescale, postscale),
                     inline=lambda comm, budget: _bytes_of(tensor, budget), complete=complete, speculate=speculate)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], op: str, prescale: float, postscale: float,
                          name: str | None) -> Operation:
    if not tensors:
        raise ValueError("grouped_reducescatter takes a non-empty list of tensors")
    _check_scatter_op(op, "grouped_reducescatter")
    for t in tensors:
        _check_tensor(t, "grouped_reducescatter")
        if t.dim() == 0:
            raise ValueError("grouped_reducescatter takes tensors of at least one dimension")
    return Operation(Descriptor(Kind.GROUPED_REDUCESCATTER, tuple(tensors), _OP_CODES[op], name=name,
                                prescale=prescale, postscale=postscale),
                     lambda comm: [_reduce_scatter_one(comm, t, op, prescale, postscale) for t in tensors])


def barrier() -> Operation:
    """As Horovod's: agreed on in a round, then carried out as a collective of its own (a small
    allreduce), never inline. Inline, a barrier was its round alone, and a rank that finished the
    collective before it a moment after its peers could leave the barrier a moment sooner than
    the last rank's arrival measured from its own clock: Horovod's `test_global_barrier_op`
    (rank 0 sleeps 5 s, every rank's barrier must take 5 s) failed on a loaded machine."""
    def run(comm: Any) -> None:
        comm.allreduce_(torch.zeros(1))

    return Operation(Descriptor(Kind.BARRIER, ()), run)


def join() -> Operation:
    """Horovod's join: this rank has no more data. Until every rank has joined, the others'
    allreduces and barriers go on with this rank standing in (the reduction's identity: zeros
    for a sum); then every rank's join gives the rank that joined last."""
    def run(comm: Any) -> int:  # (never run: the queue answers a join from its rounds)
        raise RuntimeError("a join is answered by the operations' rounds, not run")

    return Operation(Descriptor(Kind.JOIN, ()), run)
