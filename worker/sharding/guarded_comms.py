"""FSDP2's all-gather and reduce-scatter on a generation's Gloo mesh, waited for together with the
generation's end.

Found with native stacks here (`bench/sharded.py`, 2 stalls in about 30 runs, and once on a
16-core machine): a survivor that was still training while its peers rolled back posted FSDP2's
next all-gather on a mesh whose Gloo pairs were closing, its peers' connections just shut
(`mesh_sockets`) and the killed worker's gone. Gloo never failed that send, and the survivor
waited in it for the whole collective timeout ("Timed out waiting 60000ms for send operation to
complete"); the next ring waited for the survivor. By the time the generation's end reached it,
Gloo had closed every socket of its mesh, so the cut found nothing left to shut down. torch waits
for these collectives in C++, out of Ringmaster's reach.

So every FSDP2 module a `ShardedState` builds gets two communications (FSDP2's own
`set_custom_all_gather` / `set_custom_reduce_scatter`, in `fsdp_comms`, imported with
`ShardedState` only: FSDP2's modules take 0.9 s of every worker's start). Each issues torch's own
collective asynchronously and waits for it in slices, raising `HorovodInternalError` (a rollback) once the
generation is over. A collective left behind this way is recorded (`abandoned`) so that
`generation_mesh.release()` keeps its process groups alive until it ends: a Gloo group's destructor
waits for its work. CUDA tensors (NCCL) are passed through unchanged: FSDP2 orders them on
streams and NCCL's own abort ends them.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch.distributed as dist

from ringmaster.worker.train.collectives import _future_of
from ringmaster.worker.train.errors import HorovodInternalError

#: How often a wait looks at whether the generation is over, in seconds (a collective that ends
#: sooner wakes it at once).
SLICE_S = 0.2

#: Collectives given up on because their generation ended, not yet known to have ended in Gloo.
abandoned: list[dist.Work] = []

Over = Callable[[], "str | None"]


def wait_guarded(work: dist.Work, over: Over, what: str) -> None:
    """Wait for `work`; HorovodInternalError as soon as `over()` says why the generation ended
    (the collective is then left to Gloo and recorded in `abandoned`). The wait is on the work's
    future: a Gloo work waited for with a timeout that runs out is failed by torch."""
    future, _ = _future_of(work)
    finished = threading.Event()
    future.add_done_callback(lambda _: finished.set())
    while not future.done():
        why = over()
        if why is not None:
            abandoned.append(work)
            raise HorovodInternalError(f"{what} on the generation's mesh was given up: the generation is over ({why})")
        finished.wait(SLICE_S)
    future.wait()  # (its own error, if it failed)


def pending_abandoned() -> list[dist.Work]:
    """The abandoned collectives Gloo still runs (those that ended are forgotten)."""
    abandoned[:] = [work for work in abandoned if not work.is_completed()]
    return list(abandoned)
