"""Gradient compression for allreduce, as Horovod offers it (`hvd.Compression.fp16`)."""

from __future__ import annotations

import torch


class NoneCompressor:
    @staticmethod
    def wire_dtype(dtype: torch.dtype) -> torch.dtype:
        """The dtype a tensor of `dtype` travels as (lets the optimizer cast into kept buffers)."""
        return dtype

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, None]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: None) -> torch.Tensor:
        return tensor


class FP16Compressor:
    """Send floating point tensors as float16: half the bytes, less precision."""

    @staticmethod
    def wire_dtype(dtype: torch.dtype) -> torch.dtype:
        return torch.float16 if dtype.is_floating_point else dtype

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        dtype = tensor.dtype
        return (tensor.to(torch.float16) if tensor.is_floating_point() else tensor), dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: torch.dtype) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None and tensor.dtype != ctx else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
