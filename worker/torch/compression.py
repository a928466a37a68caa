"""Gradient compression for allreduce, as Horovod offers it (`hvd.Compression.fp16`)."""

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


class FP16Compressor:
    """Send floating point tensors as float16: half the bytes, less precision."""

    @staticmethod
    def wire_dtype(dtype: torch.dtype) -> torch.dtype:
        """float16 for floating-point dtypes; others travel unchanged."""
        return torch.float16 if dtype.is_floating_point else dtype

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        """The tensor as float16 (if floating point) and its own dtype, for `decompress`."""
        dtype = tensor.dtype
        return (tensor.to(torch.float16) if tensor.is_floating_point() else tensor), dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: torch.dtype) -> torch.Tensor:
        """The received tensor back in the dtype `compress` saw."""
        return tensor.to(ctx) if ctx is not None and tensor.dtype != ctx else tensor


class Compression:
    """Horovod's names: `hvd.Compression.none` and `hvd.Compression.fp16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
