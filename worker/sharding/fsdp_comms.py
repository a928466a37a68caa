"""FSDP2's all-gather and reduce-scatter, each waited for with the generation's end
(`guarded_comms.wait_guarded` says why). Imported by `sharded_state` only: FSDP2's collectives
bring DTensor, 0.9 s of CPU that a worker without sharded state would spend at its start."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ringmaster.worker.sharding.guarded_comms import Over, wait_guarded

try:  # torch's own defaults, for their buffers' allocation (private to FSDP2; absent: nothing is guarded)
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
except ImportError:  # pragma: no cover - another torch
    DefaultAllGather = DefaultReduceScatter = None  # type: ignore[assignment,misc]


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
