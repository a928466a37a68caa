"""Horovod's PyTorch API on Ringmaster: `import ringmaster.torch as hvd`.

A Horovod elastic script runs with only its import line changed. Collectives go through
`torch.distributed` (Gloo on CPU, NCCL on GPU) on the ring of the current generation; each is
bounded, so a dead or hung peer raises `HorovodInternalError` instead of hanging.
"""

from __future__ import annotations

if __name__ != "ringmaster.torch":  # pragma: no cover - a wrong import path, caught at once
    raise ImportError(f"the training API is `ringmaster.torch` (import ringmaster.torch as hvd), not {__name__}")

from ringmaster.torch import elastic
from ringmaster.torch.basics import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    ccl_built,
    context,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    report,
    rocm_built,
    shutdown,
    size,
)
from ringmaster.torch.collectives import (
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from ringmaster.torch.compression import Compression
from ringmaster.torch.optimizer import DistributedOptimizer
from ringmaster.torch.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from ringmaster.torch.sync_batch_norm import SyncBatchNorm
from ringmaster.torch.timeline import start_timeline, stop_timeline
from ringmaster.worker.train.errors import (
    CollectiveMismatchError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    WorkersFailedError,
)

__all__ = [
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression", "DistributedOptimizer", "HorovodInternalError",
    "HostsUpdatedInterrupt", "WorkersFailedError", "CollectiveMismatchError", "ProcessSet", "SyncBatchNorm",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "ccl_built", "context", "cross_rank", "cross_size", "cuda_built", "ddl_built", "elastic", "gloo_built",
    "gloo_enabled", "global_process_set", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "init", "is_homogeneous", "is_initialized", "join", "local_rank", "local_size",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "report", "rocm_built", "shutdown", "size", "sparse_allreduce_async",
    "start_timeline", "stop_timeline", "synchronize",
]
