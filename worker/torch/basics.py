"""The worker's place in the job: joining it (`init`), leaving it, and its rank and size in the
current generation, which change at every reset. Horovod's names; `ringmaster.torch`
re-exports them."""

from __future__ import annotations

import atexit
import math

import torch
import torch.distributed as dist

from ringmaster.common import figures
from ringmaster.worker.train.context import WorkerContext
from ringmaster.worker.train.exiting import exit_promptly, install_crash_hook

# Reduction ops, as Horovod names them.
Average = "average"
Sum = "sum"
Min = "min"
Max = "max"
Adasum = "adasum"  # see ringmaster.torch.adasum
_OPS = {Sum: dist.ReduceOp.SUM, Average: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX, Adasum: None}

_context: WorkerContext | None = None
atexit.register(exit_promptly)  # (registered first, so it runs last: after the script's own exit handlers)


def init() -> None:
    """Join the job (idempotent). Outside `ringmaster run` this is a job of one worker."""
    global _context
    if _context is None:
        context = WorkerContext()
        context.init()
        _context = context
        install_crash_hook()  # a crash ends the process promptly too: see ringmaster.worker.train.exiting
        atexit.register(shutdown)  # leave before the interpreter finalizes: see WorkerContext.shutdown


def shutdown() -> None:
    """Leave the job's rings and the rendezvous (also done at interpreter exit)."""
    global _context
    if _context is not None:
        _context.shutdown()
        _context = None
        atexit.unregister(shutdown)


def is_initialized() -> bool:
    """Has `hvd.init()` run (and `hvd.shutdown()` not since)?"""
    return _context is not None


def context() -> WorkerContext:
    """This worker's Ringmaster context (ring, rendezvous link); ValueError before `hvd.init()`."""
    if _context is None:
        raise ValueError("Ringmaster has not been initialized; call hvd.init() first")
    return _context


def report(loss: float | torch.Tensor | None = None, *, batch_size: int | None = None,
           noise_scale: float | None = None) -> None:
    """Report the training loss (a number or a one-element tensor) for the job's status, dashboard and metrics; call it
    as often as you like: the newest value goes out with the next heartbeat.

    For a pool's `goodput` policy a script may also say its batch per worker (`batch_size`,
    samples per step) and its gradient noise scale (`noise_scale`, in samples: the global batch
    beyond which larger batches learn markedly less per sample; Pollux's and McCandlish et al.'s
    B_noise). With both, the policy counts a step at a global batch B (batch_size x workers) as
    worth (noise_scale + batch_size) / (noise_scale + B) of one at a single worker's batch, so
    slots go where they speed learning, not only samples, up."""
    if batch_size is not None and not (isinstance(batch_size, int) and 0 < batch_size <= figures.MAX_BATCH):
        raise ValueError(f"batch_size {batch_size!r}: samples per worker per step, a whole number from 1 to "
                         f"{figures.MAX_BATCH}")
    if noise_scale is not None:
        noise_scale = float(noise_scale.item() if hasattr(noise_scale, "item") else noise_scale)
        if not (math.isfinite(noise_scale) and 0 < noise_scale <= figures.MAX_NOISE_SCALE):
            raise ValueError(f"noise_scale {noise_scale!r}: the gradient noise scale in samples, more than 0 and "
                             f"at most {figures.MAX_NOISE_SCALE:g}")
    if batch_size is not None or noise_scale is not None:
        context().figures.scaling_hints(batch_size, noise_scale)
    if loss is not None:
        value = float(loss.item() if hasattr(loss, "item") else loss)
        context().figures.report(value)


def rank() -> int:
    """This worker's rank in the current generation (0 .. size()-1); it can change at a reset."""
    return context().topology()[0]


def size() -> int:
    """The number of workers in the current generation; it changes when the job grows or shrinks."""
    return context().topology()[1]


def local_rank() -> int:
    """This worker's rank among the workers on its host (use it to pick a GPU)."""
    return context().topology()[2]


def local_size() -> int:
    """The number of workers on this worker's host in the current generation."""
    return context().topology()[3]


def cross_rank() -> int:
    """The rank of this worker's host among the hosts that have a worker with its local rank."""
    return context().topology()[4]


def cross_size() -> int:
    """The number of hosts that have a worker with this worker's local rank."""
    return context().topology()[5]


def is_homogeneous() -> bool:
    """Horovod's question; True: every host runs as many workers as its slots allow."""
    return True


def gloo_enabled() -> bool:
    """True: CPU tensors always go over Gloo rings."""
    return True


def nccl_built() -> bool:
    """True when CUDA is available: CUDA tensors then go over NCCL rings."""
    return torch.cuda.is_available()
