"""Which workers make a generation when a job trains in replica groups (`--group-size K`): a
pure function, tested on its own and through the formation.

A replica group is K consecutive ranks (group g holds ranks gK .. gK+K-1): inside it the model
is sharded (FSDP2 on the group's own mesh), across groups it is replicated. So a group is only
of use whole. The rules:

- A group of the last generation stays only if every one of its members is still there: a
  member lost takes its whole group out (its shards went with it). Groups that stay keep their
  order, so rank 0 stays rank 0 while its group lives.
- The rest (members of broken groups, newcomers) form new groups, K at a time, after them:
  first a group from each host with K of them to give (a group never spans more hosts than it
  must), then the remainders, from the hosts with the most left first.
- Never more than `limit` workers, and only whole groups: a worker left over waits for the
  next group to be complete (`placed` says who is in).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

from ringmaster.rendezvous.control.assignment import WorkerSlot


class Arrangement(NamedTuple):
    """The generation's workers in rank order (whole groups), and those left waiting."""

    placed: list[WorkerSlot]
    waiting: list[WorkerSlot]


def whole_groups(count: int, group_size: int) -> int:
    """Workers in the whole groups that `count` workers make."""
    return count - count % group_size


def kept_groups(previous: Sequence[str], alive: Iterable[str], group_size: int) -> list[list[str]]:
    """The last generation's groups (`previous`: its member ids in rank order) whose members are
    all in `alive`, in their order."""
    present = set(alive)
    groups = [list(previous[i: i + group_size]) for i in range(0, whole_groups(len(previous), group_size), group_size)]
    return [g for g in groups if all(worker in present for worker in g)]


def pack(slots: Sequence[WorkerSlot], group_size: int) -> list[list[WorkerSlot]]:
    """New groups from `slots` (each kept in the order given within its host): whole groups from
    each host first (hosts in the order they first appear), then the hosts' remainders, the
    largest first, filled one group after another. Slots that make no whole group are left out."""
    by_host: dict[str, list[WorkerSlot]] = {}
    for slot in slots:
        by_host.setdefault(slot.host, []).append(slot)
    groups: list[list[WorkerSlot]] = []
    remainders: list[list[WorkerSlot]] = []
    for host_slots in by_host.values():
        full = whole_groups(len(host_slots), group_size)
        groups.extend(host_slots[i: i + group_size] for i in range(0, full, group_size))
        if full < len(host_slots):
            remainders.append(host_slots[full:])
    rest = [slot for left in sorted(remainders, key=len, reverse=True) for slot in left]  # (sorted is stable)
    groups.extend(rest[i: i + group_size] for i in range(0, whole_groups(len(rest), group_size), group_size))
    return groups


def arrange(survivors: Sequence[WorkerSlot], previous: Sequence[str], newcomers: Sequence[WorkerSlot],
            group_size: int, limit: int | None) -> Arrangement:
    """The next generation of a job in groups of `group_size`: `survivors` (members of the last
    generation still there, in its rank order, `previous` its member ids in rank order) and
    `newcomers`, at most `limit` workers (None: no limit)."""
    if group_size < 1:
        raise ValueError(f"a group size is at least 1, not {group_size}")
    cap = whole_groups(limit, group_size) if limit is not None else None
    by_id = {slot.worker_id: slot for slot in survivors}
    if len(by_id) != len(survivors) or any(slot.worker_id in by_id for slot in newcomers):
        raise ValueError("a worker appears twice in one generation")
    kept = kept_groups(previous, by_id, group_size)
    in_kept = {worker for group in kept for worker in group}
    placed = [by_id[worker] for group in kept for worker in group]
    loose = [slot for slot in survivors if slot.worker_id not in in_kept] + list(newcomers)
    placed += [slot for group in pack(loose, group_size) for slot in group]
    if cap is not None:
        placed = placed[:cap]
    chosen = {slot.worker_id for slot in placed}
    return Arrangement(placed, [slot for slot in (*survivors, *newcomers) if slot.worker_id not in chosen])

