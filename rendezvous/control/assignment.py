"""Who gets which rank in a generation: a pure function, tested exhaustively.

Rules (docs/architecture.md, "A change of hosts"): survivors keep their relative order, so rank 0 stays rank 0
while it lives and holds the newest commit; newcomers go last in the order given; never more
than `max_np` workers. Local and cross ranks follow Horovod's definitions: `local_rank` is the
position among the generation's workers on the same host (in rank order), `cross_rank` the
position of the host among hosts that have a worker with that local rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class WorkerSlot:
    worker_id: str
    host: str


@dataclass(frozen=True)
class RankAssignment:
    worker_id: str
    host: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def assign_ranks(
    survivors: Sequence[WorkerSlot], newcomers: Sequence[WorkerSlot], max_np: int | None = None
) -> list[RankAssignment]:
    """Order `survivors` (already in their previous rank order) then `newcomers`, capped at `max_np`."""
    seen: set[str] = set()
    ordered: list[WorkerSlot] = []
    for slot in (*survivors, *newcomers):
        if slot.worker_id in seen:
            raise ValueError(f"worker {slot.worker_id} appears twice in one generation")
        seen.add(slot.worker_id)
        ordered.append(slot)
    if max_np is not None:
        ordered = ordered[:max_np]
    size = len(ordered)

    local_rank: list[int] = []
    per_host: dict[str, int] = {}
    for slot in ordered:
        local_rank.append(per_host.get(slot.host, 0))
        per_host[slot.host] = per_host.get(slot.host, 0) + 1

    host_order: list[str] = list(dict.fromkeys(slot.host for slot in ordered))
    hosts_with_local: dict[int, list[str]] = {}
    for host in host_order:
        for lr in range(per_host[host]):
            hosts_with_local.setdefault(lr, []).append(host)

    cross_rank = {lr: {host: i for i, host in enumerate(hosts)} for lr, hosts in hosts_with_local.items()}
    result = []
    for rank, (slot, lr) in enumerate(zip(ordered, local_rank)):
        crossing = hosts_with_local[lr]
        result.append(
            RankAssignment(
                worker_id=slot.worker_id,
                host=slot.host,
                rank=rank,
                size=size,
                local_rank=lr,
                local_size=per_host[slot.host],
                cross_rank=cross_rank[lr][slot.host],
                cross_size=len(crossing),
            )
        )
    return result
