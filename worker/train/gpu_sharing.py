"""Whether this worker may put CUDA tensors on an NCCL ring: NCCL takes one GPU per rank.

NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected", an
`ncclInvalidUsage` raised from deep inside the first CUDA collective). A job that places more
workers on a host than the host has GPUs still trains on CPU tensors (its Gloo ring is
unaffected), so the NCCL ring is left out and a CUDA collective is refused up front with what to
change, instead of NCCL's message from the middle of training.
"""

from __future__ import annotations


def nccl_refusal(host: str, workers_here: int, gpus_here: int) -> str | None:
    """None when each of this host's `workers_here` workers can have a GPU of its own; else the
    error a CUDA collective raises."""
    if workers_here <= gpus_here:
        return None
    return (f"a CUDA tensor was given, but {workers_here} workers of this job share host {host}'s {gpus_here} "
            f"GPU(s), and NCCL takes one GPU per worker (it refuses two on one GPU). Give the host at most "
            f"{gpus_here} slot(s) (`{host}:{gpus_here}` in --hosts or the discovery script's output, or "
            f"-np {gpus_here} on this machine), or keep the tensors on the CPU")
