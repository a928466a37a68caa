"""What a Gloo ring carries as it is, and how every other dtype travels.

Gloo's collectives take nine dtypes (torch's ProcessGroupGloo: float32, float64, float16,
bfloat16, int8, uint8, int32, int64, bool) and raise "Invalid scalar type" for the rest, which
Horovod takes on every op (its own Gloo path does the arithmetic itself). Here a collective that
only moves bytes (a broadcast, an allgather) moves another dtype's bytes as uint8; a reduction
runs in a wider dtype that Gloo takes (int16 and uint16 in int32, uint32 and uint64 in int64,
the float8 kinds in float32) and is cast back, which wraps as the narrow type's own arithmetic
would; a complex sum runs on its real view. Pure: the communicator applies it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

#: The dtypes Gloo's collectives take as they are.
NATIVE = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
                    torch.int64, torch.bool})
#: Where a reduction of another dtype runs.
_WIDER = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64}


def native(tensor: torch.Tensor) -> bool:
    """Does Gloo take this tensor as it is? (CUDA tensors go to NCCL, not Gloo.)"""
    return tensor.is_cuda or tensor.dtype in NATIVE


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a 1-D uint8 view (what a move of another dtype sends)."""
    return tensor.reshape(-1).view(torch.uint8)


def for_reduction(tensor: torch.Tensor, op: object) -> tuple[torch.Tensor, Callable[[], None]]:
    """A tensor Gloo can reduce in place for `tensor` (not native), and what copies the result
    back once the reduction is done. ValueError for a reduction the dtype has none of."""
    if tensor.is_complex():
        if op != dist.ReduceOp.SUM:
            raise ValueError(f"a {tensor.dtype} tensor can only be summed or averaged (its min, max and product are "
                             "not elementwise); use hvd.Sum or hvd.Average")
        if tensor.is_contiguous():
            return torch.view_as_real(tensor), _nothing
        carrier = torch.view_as_real(tensor.contiguous())
        return carrier, lambda: _copy(tensor, torch.view_as_complex(carrier))
    wider = wider_dtype(tensor.dtype)
    if wider is None:  # (not a native dtype: none to widen it to)
        raise ValueError(f"a {tensor.dtype} tensor cannot be reduced on a Gloo ring; cast it to a dtype Gloo takes "
                         f"({', '.join(sorted(str(d).removeprefix('torch.') for d in NATIVE))})")
    carrier = tensor.to(wider)
    return carrier, lambda: _copy(tensor, carrier)


def wider_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """Where a reduction of `dtype` runs when Gloo (or torch's own arithmetic, for the unsigned
    kinds) does not take it; None when it needs none, or has none (then refused)."""
    if dtype in NATIVE or dtype.is_complex:
        return None
    return _WIDER.get(dtype, torch.float32 if dtype.is_floating_point else None)


def _copy(into: torch.Tensor, result: torch.Tensor) -> None:
    into.copy_(result)  # (a narrower integer wraps, as its own arithmetic would have)


def _nothing() -> None:
    """The result is already in place."""
