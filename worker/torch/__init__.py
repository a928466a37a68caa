"""Horovod's PyTorch API on Ringmaster: `import ringmaster.torch as hvd`.

A Horovod elastic script runs with only its import line changed. Collectives go through
`torch.distributed` (Gloo on CPU, NCCL on GPU) on the ring of the current generation; each is
bounded, so a dead or hung peer raises `HorovodInternalError` instead of hanging.
"""

from __future__ import annotations

if __name__ != "ringmaster.torch":  # pragma: no cover - a wrong import path, caught at once
    raise ImportError(f"the training API is `ringmaster.torch` (import ringmaster.torch as hvd), not {__name__}")

from ringmaster.torch import adasum
from ringmaster.torch.basics import (
    Adasum, Average, Max, Min, Sum, context, cross_rank, cross_size, gloo_enabled, init, is_homogeneous,
    is_initialized, local_rank, local_size, nccl_built, rank, report, shutdown, size,
)
from ringmaster.torch.collectives import (
    allgather, allgather_object, allreduce, allreduce_, barrier, broadcast, broadcast_, broadcast_object,
    broadcast_optimizer_state, broadcast_parameters, grouped_allreduce, grouped_allreduce_, join,
)
from ringmaster.torch.compression import Compression
from ringmaster.torch.optimizer import DistributedOptimizer
from ringmaster.worker.train.errors import HorovodInternalError, HostsUpdatedInterrupt, WorkersFailedError

from ringmaster.torch import elastic

__all__ = [
    "Average", "Sum", "Min", "Max", "Adasum", "Compression", "DistributedOptimizer", "HorovodInternalError",
    "HostsUpdatedInterrupt", "WorkersFailedError", "allgather", "allgather_object", "allreduce", "allreduce_",
    "barrier", "broadcast", "broadcast_", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "context", "cross_rank", "cross_size", "elastic", "gloo_enabled", "grouped_allreduce", "grouped_allreduce_",
    "init", "is_homogeneous", "is_initialized", "join", "local_rank", "local_size", "nccl_built", "rank",
    "report", "shutdown", "size",
]
