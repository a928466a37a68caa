"""How many intra-op threads a worker gets when its user did not say (OMP_NUM_THREADS).

torch sizes each process' intra-op pool to the machine's cores. Several workers on one machine
then run cores x workers threads that preempt one another in every op and every collective's
copy: on a 2-core machine a 1 MB alltoall of two workers took 5-6x torch.distributed's time
(the benchmark's processes had one thread each), and every test's job ran slower for it.
torchrun sets OMP_NUM_THREADS=1 where it starts more than one worker on a node; an agent gives
each worker its share of the machine's cores instead (at least one), and one thread where hosts
are emulated on one machine (its agent cannot know how many others share the cores). A user's
own OMP_NUM_THREADS, in the environment the job was started from, always stands.
"""

from __future__ import annotations

import os
from typing import Mapping

from ringmaster.proto.environment import SHARED_MACHINE as SHARED_MACHINE_ENV
from ringmaster.proto.environment import THREADS as THREADS_ENV


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's share)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_threads(environ: Mapping[str, str], workers_here: int, cpus: int) -> str | None:
    """The OMP_NUM_THREADS to give a worker that runs beside `workers_here - 1` others of its
    agent on a machine of `cpus` CPUs, or None to leave torch's own default (the user set one, or
    the worker is alone on its machine)."""
    if environ.get(THREADS_ENV, "").strip():
        return None
    if environ.get(SHARED_MACHINE_ENV) == "1":
        return "1"
    if workers_here <= 1:
        return None
    return str(max(1, cpus // workers_here))


def applicable_threads(value: str | None) -> int | None:
    """The thread count a warm spare applies with torch.set_num_threads when it becomes a worker
    (OpenMP read the variable when the spare started), or None for a value that is not one
    positive number (OpenMP's per-level lists are left to OpenMP)."""
    if value is None or not value.strip().isdigit():
        return None
    count = int(value)
    return count if 0 < count <= 4096 else None
