"""The worker's place in the job: joining it (`init`), leaving it, and its rank and size in the
current generation, which change at every reset. Horovod's names; `ringmaster.torch`
re-exports them."""

from __future__ import annotations

import atexit
import math

import torch

from ringmaster.common import figures
from ringmaster.torch.operations import Adasum, Average, Max, Min, Product, Sum  # noqa: F401  (Horovod's names)
from ringmaster.worker.train.context import WorkerContext
from ringmaster.worker.train.exiting import exit_promptly, install_crash_hook

_context: WorkerContext | None = None
#: The context kept after an explicit `hvd.shutdown()`: `hvd.init()` takes it up again (see shutdown).
_parked: WorkerContext | None = None
atexit.register(exit_promptly)  # (registered first, so it runs last: after the script's own exit handlers)


def init(comm: object = None, process_sets: object = None) -> None:
    """Join the job (idempotent). Outside `ringmaster run` this is a job of one worker.

    `process_sets`: Horovod's static process sets (a list of `hvd.ProcessSet`), registered in
    order, or "dynamic" (sets may always be added here). `comm` (an MPI communicator in Horovod)
    must be None: this build has no MPI."""
    global _context, _parked
    if comm is not None:
        raise ValueError("hvd.init(comm=...) takes an MPI communicator, and this build has no MPI (hvd.mpi_built() is "
                         "False): call hvd.init() and use process sets for subsets of the workers")
    if _context is None:
        if _parked is not None:  # a new session of the same worker: its ring, or the next one
            _context, _parked = _parked, None
        else:
            context = WorkerContext()
            context.init()
            _context = context
            install_crash_hook()  # a crash ends the process promptly too: see ringmaster.worker.train.exiting
            atexit.register(_leave)  # leave before the interpreter finalizes: see WorkerContext.shutdown
    if process_sets is not None and process_sets != "dynamic":
        from ringmaster.torch import process_sets as sets
        for process_set in process_sets:  # type: ignore[attr-defined]
            if process_set.process_set_id is None:
                sets.add_process_set(process_set)


def shutdown() -> None:
    """End this worker's Horovod session, as `hvd.shutdown()` does: operations raise until the
    next `hvd.init()`, and process sets are forgotten. The worker stays in the job (its peers
    go on training), so `hvd.init()` afterwards resumes in the current generation's ring, or
    the next one; it leaves the job when the interpreter exits."""
    global _context, _parked
    if _context is not None:
        from ringmaster.torch import process_sets as sets
        comm = _context.comm
        if comm is not None and comm._ops is not None:
            comm._ops.drain()  # what was queued before the shutdown still runs
        sets.forget_all()
        from ringmaster.torch.collectives import forget_handles
        forget_handles()
        _parked, _context = _context, None


def _leave() -> None:
    """At interpreter exit: leave the job's rings and the rendezvous (see WorkerContext.shutdown)."""
    global _context, _parked
    for context in (_context, _parked):
        if context is not None:
            context.shutdown()
    _context = _parked = None
    atexit.unregister(_leave)


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


def gloo_built() -> bool:
    """True: Gloo (torch.distributed's) carries every CPU collective."""
    return True


def nccl_built() -> int:
    """NCCL's version code (as Horovod's: 2.21.5 is 22105) when CUDA is available, else 0."""
    if not torch.cuda.is_available():
        return 0
    try:
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return 0
    return major * 10000 + minor * 100 + patch


def cuda_built() -> bool:
    """Does this torch have CUDA (its NCCL ring is used for CUDA tensors)?"""
    return torch.version.cuda is not None


def rocm_built() -> bool:
    """Does this torch have ROCm?"""
    return getattr(torch.version, "hip", None) is not None


def mpi_built() -> bool:
    """False: there is no MPI here (Gloo and NCCL rings do what Horovod's MPI did)."""
    return False


def mpi_enabled() -> bool:
    """False: there is no MPI here."""
    return False


def mpi_threads_supported() -> bool:
    """Horovod raises this when MPI is not enabled; so does this."""
    raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled. (Ringmaster has no MPI: "
                     "hvd.mpi_enabled() is False)")


def ccl_built() -> bool:
    """False: there is no oneCCL here."""
    return False


def ddl_built() -> bool:
    """False: there is no IBM DDL here."""
    return False
