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

So every FSDP2 module a `ShardedState` builds gets these two communications (FSDP2's own
`set_custom_all_gather` / `set_custom_reduce_scatter`). Each issues torch's own collective
asynchronously and waits for it in slices, raising `HorovodInternalError` (a rollback) once the
generation is over. A collective left behind this way is recorded (`abandoned`) so that
`generation_mesh.release()` keeps its process groups alive until it ends: a Gloo group's destructor
waits for its work. CUDA tensors (NCCL) are passed through unchanged: FSDP2 orders them on
streams and NCCL's own abort ends them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from ringmaster.worker.train.collectives import _future_of
from ringmaster.worker.train.errors import HorovodInternalError

try:  # torch's own defaults, for their buffers' allocation (private to FSDP2; absent: nothing is guarded)
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
except ImportError:  # pragma: no cover - another torch
    DefaultAllGather = DefaultReduceScatter = None  # type: ignore[assignment,misc]

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


if DefaultAllGather is not None:
    class GuardedAllGather(DefaultAllGather):  # type: ignore[misc,valid-type]
        """FSDP2's all-gather, waited for with the generation's end (Gloo, synchronous calls)."""

        def __init__(self, over: Over) -> None:
            super().__init__()
            self.over = over

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                     async_op: bool = False) -> dist.Work | None:
            if async_op or input_tensor.device.type != "cpu":
                return super().__call__(output_tensor, input_tensor, group, async_op)
            work = dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=True)
            wait_guarded(work, self.over, "FSDP2's all-gather")
            return None

    class GuardedReduceScatter(DefaultReduceScatter):  # type: ignore[misc,valid-type]
        """FSDP2's reduce-scatter, waited for with the generation's end (Gloo, synchronous calls)."""

        def __init__(self, over: Over) -> None:
            super().__init__()
            self.over = over

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                     op: Any, async_op: bool = False) -> Any:  # (None when waited for here, as torch's)
            if async_op or input_tensor.device.type != "cpu":
                return super().__call__(output_tensor, input_tensor, group, op, async_op)
            work = dist.reduce_scatter_single(output=output_tensor, input=input_tensor, group=group, op=op,
                                              async_op=True)
            wait_guarded(work, self.over, "FSDP2's reduce-scatter")
            return None


def guard(objects: Any, over: Over) -> int:
    """Give every FSDP2 module among `objects` (a dict of built objects) the guarded
    communications. Returns how many modules got them (a module FSDP2 will not give a custom
    communication, one of several parameter groups, keeps its own)."""
    if DefaultAllGather is None:
        return 0
    from torch.distributed.fsdp import FSDPModule

    guarded = 0
    for value in objects.values() if isinstance(objects, dict) else ():
        if not isinstance(value, torch.nn.Module):
            continue
        for module in value.modules():
            if isinstance(module, FSDPModule):
                try:
                    module.set_custom_all_gather(GuardedAllGather(over))
                    module.set_custom_reduce_scatter(GuardedReduceScatter(over))
                except ValueError:
                    continue
                guarded += 1
    return guarded
