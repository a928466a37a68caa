"""Who gets which rank in a generation: a pure function, tested exhaustively.

Rules (docs/architecture.md, "A change of hosts"): survivors keep their relative order, so rank 0 stays rank 0
while it lives and holds the newest commit; newcomers go last in the order given; never more
than `max_np` workers. Local and cross ranks follow Horovod's definitions: `local_rank` is the
position among the generation's workers on the same host (in rank order), `cross_rank` the
position of the host among hosts that have a worker with that local rank.
"""

from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple, Sequence


class WorkerSlot(NamedTuple):
    """(Named tuples: a generation makes one of each per worker, 32,768 at 4,096 x 8, and a
    tuple is made in a third of a frozen dataclass' time.)"""

    worker_id: str
    host: str


class RankAssignment(NamedTuple):
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
    ordered = [*survivors, *newcomers]
    if len({slot.worker_id for slot in ordered}) != len(ordered):
        seen: set[str] = set()
        for slot in ordered:
            if slot.worker_id in seen:
                raise ValueError(f"worker {slot.worker_id} appears twice in one generation")
            seen.add(slot.worker_id)
    if max_np is not None:
        ordered = ordered[:max_np]
    size = len(ordered)

    local_rank: list[int] = []
    per_host: dict[str, int] = {}
    for slot in ordered:
        count = per_host.get(slot.host, 0)
        local_rank.append(count)
        per_host[slot.host] = count + 1

    # Hosts in rank order (`per_host` kept the order of first appearance): the cross rank of a
    # host's worker of local rank `lr` among the hosts with such a worker (`crosses[host][lr]`),
    # and how many those hosts are (`cross_size[lr]`).
    crosses: dict[str, list[int]] = {}
    cross_size: list[int] = []
    for host, count in per_host.items():
        if count > len(cross_size):
            cross_size += [0] * (count - len(cross_size))
        crosses[host] = cross_size[:count]
        for lr in range(count):
            cross_size[lr] += 1

    # (positional: a generation makes one per worker, tens of thousands in a large job)
    return [RankAssignment(worker_id, host, rank, size, lr, per_host[host], crosses[host][lr], cross_size[lr])
            for rank, ((worker_id, host), lr) in enumerate(zip(ordered, local_rank))]


def host_counts(hosts: Iterable[str]) -> dict[str, int]:
    """How many workers each host holds, given each worker's host in rank order; hosts in the
    order they first appear: what `appended_ranks` needs to know of the workers before newcomers."""
    counts: dict[str, int] = {}
    for host in hosts:
        counts[host] = counts.get(host, 0) + 1
    return counts


def appended_ranks(counts: Mapping[str, int], newcomers: Sequence[WorkerSlot]) -> list[RankAssignment]:
    """The places `assign_ranks(before, newcomers)` gives `newcomers`, knowing of the workers
    `before` them only how many each host holds (`host_counts`, in order of first appearance).

    A newcomer's likely place is told it when it is started (`tentative_rank_env`): computing every
    place in the job for it took 0.22 s per batch of newcomers at 4,096 x 8, and a growth by 64
    hosts started them in four batches as the hosts' agents connected. This walks the hosts once
    and makes a place only per newcomer."""
    per_host = dict(counts)
    local_rank: list[int] = []
    for slot in newcomers:
        count = per_host.get(slot.host, 0)
        local_rank.append(count)
        per_host[slot.host] = count + 1
    base = sum(counts.values())
    size = base + len(newcomers)
    wanted = {slot.host for slot in newcomers}
    cross_rank: dict[tuple[str, int], int] = {}
    cross_size: list[int] = []
    for host, count in per_host.items():
        if count > len(cross_size):
            cross_size += [0] * (count - len(cross_size))
        if host in wanted:
            for lr in range(count):
                cross_rank[host, lr] = cross_size[lr]
        for lr in range(count):
            cross_size[lr] += 1
    return [RankAssignment(slot.worker_id, slot.host, base + i, size, lr, per_host[slot.host],
                           cross_rank[slot.host, lr], cross_size[lr])
            for i, (slot, lr) in enumerate(zip(newcomers, local_rank))]


def order_keys(members: Sequence[RankAssignment], previous: Mapping[str, int]) -> tuple[int, ...]:
    """A key per member, strictly increasing in rank order, kept from `previous` (the last
    generation's keys) wherever the order allows. Survivors keep their relative order, so they keep
    their keys and only newcomers get new ones, above every previous key. The store keeps a
    generation's members as runs under these keys (`job_record`): a new generation then rewrites
    the runs that changed, not a list of every member (235 KB per host lost at 4,096 x 8)."""
    fresh = max(previous.values(), default=-1) + 1
    keys: list[int] = []
    last = -1
    for a in members:
        key = previous.get(a.worker_id)
        if key is None or key <= last:
            key = max(fresh, last + 1)
            fresh = key + 1
        keys.append(key)
        last = key
    return tuple(keys)
