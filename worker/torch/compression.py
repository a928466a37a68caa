"""Gradient compression for allreduce, as Horovod offers it (`hvd.Compression.fp16`), and bfloat16."""

from __future__ import annotations

import torch


class NoneCompressor:
    """No compression: tensors travel as they are."""

    @staticmethod
    def wire_dtype(dtype: torch.dtype) -> torch.dtype:
        """The dtype a tensor of `dtype` travels as (lets the optimizer cast into kept buffers)."""
        return dtype

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, None]:
        """The tensor to send and what `decompress` needs (nothing here)."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: None) -> torch.Tensor:
        """The received tensor as the caller's dtype."""
        return tensor


class _CastCompressor:
    """Send floating point tensors as `WIRE`: half the bytes of float32, less precision."""

    WIRE: torch.dtype

    @classmethod
    def wire_dtype(cls, dtype: torch.dtype) -> torch.dtype:
        """The wire dtype for floating-point dtypes; others travel unchanged."""
        return cls.WIRE if dtype.is_floating_point else dtype

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        """The tensor as the wire dtype (if floating point) and its own dtype, for `decompress`."""
        dtype = tensor.dtype
        return (tensor.to(cls.WIRE) if tensor.is_floating_point() else tensor), dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: torch.dtype) -> torch.Tensor:
        """The received tensor back in the dtype `compress` saw."""
        return tensor.to(ctx) if ctx is not None and tensor.dtype != ctx else tensor


class FP16Compressor(_CastCompressor):
    """Send floating point tensors as float16 (Horovod's `Compression.fp16`): 10 bits of
    mantissa, but values beyond 65504 overflow."""

    WIRE = torch.float16


class BF16Compressor(_CastCompressor):
    """Send floating point tensors as bfloat16: float32's range (no overflow), 7 bits of
    mantissa. Gloo also sums bfloat16 faster than float16 on CPUs."""

    WIRE = torch.bfloat16


class Compression:
    """Horovod's names: `hvd.Compression.none` and `hvd.Compression.fp16`; and `bf16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
