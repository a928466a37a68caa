"""Horovod's `SyncBatchNorm`: batch normalization over the batch of every worker together.

Each worker sums its part of the batch per channel (the sum, the sum of squares, the count, in
double precision), one allreduce adds the parts, and every worker normalizes with the mean and
variance of the whole batch, as `torch.nn.SyncBatchNorm` does. The allreduce carries gradients
(its backward is an allreduce too), so autograd gives each worker its share of the gradient of
the whole batch's statistics without a hand-written backward. Unlike Horovod's, it runs on the
CPU as well as on GPUs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ringmaster.torch.basics import Sum, size
from ringmaster.torch.collectives import allreduce


class SyncBatchNorm(_BatchNorm):
    """Applies batch normalization over the batches of all workers (N-dimensional: input
    `(N, C, ...)`); arguments as `torch.nn.BatchNorm1d/2d/3d`. In eval mode with running stats
    it is a plain batch norm (no communication)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm({self.num_features}) got {input.shape[1]} channels (input shape "
                             f"{tuple(input.shape)})")
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        momentum = self._momentum()
        if size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, True, momentum,
                                self.eps)
        return self._synced(input, momentum)

    def _momentum(self) -> float:
        if self.momentum is not None:
            return self.momentum
        tracked = int(self.num_batches_tracked) if self.num_batches_tracked is not None else 0
        return 1.0 / tracked if tracked else 0.0  # a cumulative moving average, as _BatchNorm's

    def _synced(self, input: torch.Tensor, momentum: float) -> torch.Tensor:
        channels = input.shape[1]
        per_channel = input.transpose(0, 1).reshape(channels, -1).to(torch.float64)
        count = torch.full((1,), float(per_channel.shape[1]), dtype=torch.float64, device=input.device)
        local = torch.cat([per_channel.sum(1), (per_channel * per_channel).sum(1), count])
        total = allreduce(local, op=Sum, name=None)
        n = total[-1]
        if float(n.detach()) == 0:
            raise ValueError("SyncBatchNorm got an empty batch on every worker")
        mean = total[:channels] / n
        var = (total[channels: 2 * channels] / n - mean * mean).clamp_min(0.0)
        shape = (1, channels) + (1,) * (input.dim() - 2)
        invstd = torch.rsqrt(var + self.eps)
        out = ((input.to(torch.float64) - mean.view(shape)) * invstd.view(shape)).to(input.dtype)
        if self.weight is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                unbiased = var * (n / (n - 1)) if float(n.detach()) > 1 else var
                self.running_mean.mul_(1 - momentum).add_(mean.to(self.running_mean.dtype), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.to(self.running_var.dtype), alpha=momentum)
        return out
