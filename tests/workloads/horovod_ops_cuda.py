"""Horovod's op API on CUDA tensors (the NCCL ring), checked against the same op on CPU tensors.

    horovod_ops_cuda.py OUT [DEVICE]   each rank writes OUT/<rank>.json: {case: "ok" | what differed}

DEVICE is "cuda" (the default); "cpu" runs the same script against itself, a dry run of the
script on machines without a GPU.

The CPU path (Gloo) is checked against single-process references on every machine by
`test_horovod_ops.py`; here every op is issued twice with the same inputs, once on the GPU and
once on the CPU, and the two results must agree (exactly for integers, to the dtype's precision
for floating point) and the GPU's must stay on the GPU. The inputs depend on the rank only, so
this holds for any number of workers, one per GPU (NCCL refuses two ranks on one GPU).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import torch

import ringmaster.torch as hvd

#: where the results under test are computed (the command line's DEVICE)
DEVICE = "cuda"
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTEGERS = (torch.int32, torch.int64, torch.int8, torch.uint8)


def _values(rank: int, rows: int, dtype: torch.dtype, width: int = 3) -> torch.Tensor:
    """A rank's input: small values, so that sums and products of a few ranks fit int8/uint8."""
    base = torch.arange(rows * width).reshape(rows, width) % 3 + rank % 2 + 1
    if dtype == torch.bool:
        return (base % 2 == 0)
    return base.to(dtype)


def _flat(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for part in result for t in _flat(part)]


def _compare(gpu: Any, cpu: Any) -> str:
    """"ok", or what differs between the GPU's result and the CPU's."""
    gpu_parts, cpu_parts = _flat(gpu), _flat(cpu)
    if len(gpu_parts) != len(cpu_parts):
        return f"{len(gpu_parts)} results on the GPU, {len(cpu_parts)} on the CPU"
    for g, c in zip(gpu_parts, cpu_parts):
        if g.device.type != DEVICE:
            return f"a result left the {DEVICE} ({g.device})"
        if g.dtype != c.dtype or g.shape != c.shape:
            return f"GPU gave {g.dtype}{tuple(g.shape)}, CPU {c.dtype}{tuple(c.shape)}"
        g = g.cpu()
        if g.is_floating_point():
            tolerance = 1e-2 if g.dtype in (torch.float16, torch.bfloat16) else 1e-5
            if not torch.allclose(g.double(), c.double(), rtol=tolerance, atol=tolerance):
                return f"GPU {g.tolist()} != CPU {c.tolist()}"
        elif not torch.equal(g, c):
            return f"GPU {g.tolist()} != CPU {c.tolist()}"
    return "ok"


def _case(results: dict[str, str], name: str, call: Callable[..., Any]) -> None:
    """Run `call` on DEVICE then on "cpu" and record whether they agree (or what was raised)."""
    try:
        gpu = call(DEVICE)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # the failure is the result
        results[name] = f"GPU raised {type(exc).__name__}: {exc}"[:500]
        return
    try:
        cpu = call("cpu")
    except Exception as exc:  # the CPU path refusing it too is agreement, if the GPU refused it
        results[name] = f"CPU raised {type(exc).__name__}: {exc}"[:500]
        return
    results[name] = _compare(gpu, cpu)


def main(out: pathlib.Path) -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if DEVICE == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    r: dict[str, str] = {}
    for dtype in FLOATS + INTEGERS:
        name = str(dtype).removeprefix("torch.")
        for op in ("Sum", "Min", "Max", "Product"):
            _case(r, f"allreduce.{op}.{name}",
                  lambda d, op=op, dtype=dtype: hvd.allreduce(_values(rank, 2, dtype).to(d), op=getattr(hvd, op)))
        if dtype in FLOATS:
            _case(r, f"allreduce.Average.{name}", lambda d, dtype=dtype: hvd.allreduce(_values(rank, 2, dtype).to(d)))
            _case(r, f"allreduce.scaled.{name}", lambda d, dtype=dtype: hvd.allreduce(
                _values(rank, 2, dtype).to(d), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0))
            _case(r, f"reducescatter.Average.{name}",
                  lambda d, dtype=dtype: hvd.reducescatter(_values(rank, 2 * size + 1, dtype).to(d)))
        _case(r, f"reducescatter.Sum.{name}",
              lambda d, dtype=dtype: hvd.reducescatter(_values(rank, 2 * size + 1, dtype).to(d), op=hvd.Sum))
    for dtype in FLOATS + INTEGERS + (torch.bool,):
        name = str(dtype).removeprefix("torch.")
        _case(r, f"allgather.{name}", lambda d, dtype=dtype: hvd.allgather(_values(rank, rank + 1, dtype).to(d)))
        _case(r, f"broadcast.{name}",
              lambda d, dtype=dtype: hvd.broadcast(_values(rank, 2, dtype).to(d), root_rank=size - 1))
        _case(r, f"alltoall.{name}", lambda d, dtype=dtype: _on_cpu(hvd.alltoall(
            _values(rank, sum(range(1, size + 1)), dtype).to(d), splits=[j + 1 for j in range(size)])))
        _case(r, f"alltoall.even.{name}",
              lambda d, dtype=dtype: hvd.alltoall(_values(rank, 2 * size, dtype).to(d)))
    _case(r, "allreduce.int.prescaled", lambda d: hvd.allreduce(
        torch.tensor([3, 5], dtype=torch.int32, device=d), op=hvd.Sum, prescale_factor=0.5))
    _case(r, "allreduce_.in_place", lambda d: hvd.allreduce_(_values(rank, 4, torch.float32).to(d), op=hvd.Sum))
    _case(r, "allreduce.Adasum", lambda d: hvd.allreduce(_values(rank, 4, torch.float32).to(d), op=hvd.Adasum))
    _case(r, "allreduce_async.many", lambda d: [hvd.synchronize(h) for h in [
        hvd.allreduce_async(_values(rank + k, 3, torch.float32).to(d), name=f"{d}.grad.{k}", op=hvd.Sum)
        for k in range(8)]])
    _case(r, "grouped_allreduce.mixed", lambda d: hvd.grouped_allreduce(
        [_values(rank, 2, torch.float32).to(d), _values(rank, 3, torch.float16).to(d),
         _values(rank, 1, torch.int32).to(d)], op=hvd.Sum))
    _case(r, "grouped_allgather", lambda d: hvd.grouped_allgather(
        [_values(rank, rank + 1, torch.float32).to(d), _values(rank, 1, torch.int64).to(d)]))
    _case(r, "grouped_reducescatter", lambda d: hvd.grouped_reducescatter(
        [_values(rank, size + 1, torch.float32).to(d), _values(rank, 2 * size, torch.float16).to(d)], op=hvd.Sum))
    _case(r, "allgather_async", lambda d: hvd.synchronize(hvd.allgather_async(_values(rank, rank + 2, torch.float32)
                                                                                .to(d))))
    _case(r, "alltoall_async", lambda d: _on_cpu(hvd.synchronize(hvd.alltoall_async(
        _values(rank, sum(range(1, size + 1)), torch.float32).to(d), splits=[j + 1 for j in range(size)]))))
    # splits given as a tensor on the device: the received counts come back there (Horovod's rule)
    _case(r, "alltoall.splits_tensor", lambda d: hvd.alltoall(
        _values(rank, sum(range(1, size + 1)), torch.float32).to(d),
        splits=torch.tensor([j + 1 for j in range(size)], dtype=torch.int32, device=d)))
    _case(r, "reducescatter_async", lambda d: hvd.synchronize(hvd.reducescatter_async(
        _values(rank, 2 * size, torch.float32).to(d))))
    _case(r, "broadcast_async_", lambda d: _broadcast_in_place(_values(rank, 3, torch.float32).to(d), size - 1))

    def gradient(d: str) -> list[torch.Tensor]:
        x = _values(rank, 2, torch.float32).to(d).requires_grad_(True)
        (hvd.allreduce(x, op=hvd.Sum) * (rank + 1)).sum().backward()
        y = _values(rank, 2, torch.float32).to(d).requires_grad_(True)
        hvd.allgather(y * (rank + 1)).sum().backward()
        return [x.grad, y.grad]
    _case(r, "gradients", gradient)

    def sync_batch_norm(d: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        part = (torch.randn(size * 4, 3, 5)[rank * 4: (rank + 1) * 4]).to(d).requires_grad_(True)
        norm = hvd.SyncBatchNorm(3).to(d)
        got = norm(part)
        got.pow(2).sum().backward()
        return [got.detach(), part.grad, norm.running_mean, norm.running_var]
    _case(r, "SyncBatchNorm", sync_batch_norm)

    def optimizer_step(d: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(d)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.full((4, 16), float(rank + 1), device=d)).pow(2).sum().backward()
            optimizer.step()
        return [p.detach() for p in model.parameters()]
    _case(r, "DistributedOptimizer", optimizer_step)
    tmp = out / f"{rank}.tmp"
    tmp.write_text(json.dumps({"rank": rank, "size": size, "nccl": hvd.nccl_built(), "cases": r}))
    os.replace(tmp, out / f"{rank}.json")


def _on_cpu(result: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """alltoall's (rows, received counts) with the counts checked to be on the CPU, where Horovod
    gives them when `splits` is a list, and moved beside the rows so that `_compare` takes them."""
    rows, received = result
    if received.device.type != "cpu":
        raise AssertionError(f"splits given as a list, but the received counts are on {received.device}, not the CPU")
    return rows, received.to(rows.device)


def _broadcast_in_place(tensor: torch.Tensor, root: int) -> torch.Tensor:
    hvd.synchronize(hvd.broadcast_async_(tensor, root_rank=root))
    return tensor


if __name__ == "__main__":
    DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cuda"
    main(pathlib.Path(sys.argv[1]))
