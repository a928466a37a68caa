"""How many slots each job gets under each policy: first admission (each job's `--min-np`,
together or not at all: gang), then growth toward `--max-np` with what is left over.

- `fifo`: running jobs keep their minimums; waiting jobs are admitted in submission order, and
  a later job that fits is admitted while an earlier one cannot be yet (backfill); the
  leftover goes to jobs in submission order.
- `priority`: minimums in order of priority (running first among equals, then submission), so
  a waiting job of higher priority takes the minimum of a lower running one, which is
  suspended; the leftover goes by priority, then submission.
- `fair`: running jobs keep their minimums; waiting jobs are admitted from the queue that holds
  the least per unit of weight; the leftover is divided between queues by weighted max-min
  fairness (`shares.water_fill`) and inside a queue equally between its jobs, so a queue's
  unused share is lent to others and taken back when it has work.

`fixed` jobs (held by the minimum interval between resizes) keep their size and are counted
first. Pure: the jobs, the slots and the fixed sizes in, a size per job out (0: not running).
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from ringmaster.rendezvous.scheduling.model import JobAsk, Settings
from ringmaster.rendezvous.scheduling.shares import water_fill

POLICIES = ("fifo", "priority", "fair")
Sizes = dict[str, int]


def _admit(ordered: Iterable[JobAsk], capacity: int, sizes: Sizes) -> int:
    """Give each job in `ordered` (not yet sized) its minimum while it fits; the slots left."""
    for job in ordered:
        if job.id in sizes:
            continue
        if job.min_np <= capacity:
            sizes[job.id] = job.min_np
            capacity -= job.min_np
        else:
            sizes[job.id] = 0
    return capacity


def _grow_in_order(ordered: Iterable[JobAsk], sizes: Sizes, fixed: Mapping[str, int], left: int) -> None:
    for job in ordered:
        if left <= 0:
            return
        if job.id in fixed or sizes[job.id] == 0:
            continue
        more = min(job.max_np - sizes[job.id], left)
        sizes[job.id] += more
        left -= more


def _start(capacity: int, fixed: Mapping[str, int]) -> tuple[Sizes, int]:
    sizes: Sizes = dict(fixed)
    return sizes, capacity - sum(fixed.values())


def fifo(jobs: list[JobAsk], capacity: int, fixed: Mapping[str, int], settings: Settings) -> Sizes:
    sizes, left = _start(capacity, fixed)
    by_arrival = sorted(jobs, key=lambda j: (j.submitted, j.id))
    left = _admit([j for j in by_arrival if j.running], left, sizes)
    left = _admit(by_arrival, left, sizes)
    _grow_in_order(by_arrival, sizes, fixed, left)
    return sizes


def priority(jobs: list[JobAsk], capacity: int, fixed: Mapping[str, int], settings: Settings) -> Sizes:
    sizes, left = _start(capacity, fixed)
    left = _admit(sorted(jobs, key=lambda j: (-j.priority, not j.running, j.submitted, j.id)), left, sizes)
    _grow_in_order(sorted(jobs, key=lambda j: (-j.priority, j.submitted, j.id)), sizes, fixed, left)
    return sizes


def fair(jobs: list[JobAsk], capacity: int, fixed: Mapping[str, int], settings: Settings) -> Sizes:
    sizes, left = _start(capacity, fixed)
    by_arrival = sorted(jobs, key=lambda j: (j.submitted, j.id))
    left = _admit([j for j in by_arrival if j.running], left, sizes)
    queues = sorted({j.queue for j in jobs})
    held = {q: sum(sizes.get(j.id, 0) for j in jobs if j.queue == q) for q in queues}
    waiting = [j for j in by_arrival if j.id not in sizes]
    while waiting:  # admit from the queue that holds least per unit of weight, among jobs that fit
        fits = [j for j in waiting if j.min_np <= left]
        if not fits:
            break
        job = min(fits, key=lambda j: (held[j.queue] / settings.weight(j.queue), j.submitted, j.id))
        sizes[job.id] = job.min_np
        left -= job.min_np
        held[job.queue] += job.min_np
        waiting.remove(job)
    for job in waiting:
        sizes[job.id] = 0
    growing = [j for j in by_arrival if sizes[j.id] > 0 and j.id not in fixed]
    cap = {q: held[q] + sum(j.max_np - sizes[j.id] for j in growing if j.queue == q) for q in queues}
    shares = water_fill(held, cap, {q: settings.weight(q) for q in queues}, left)
    for q in queues:
        members = [j for j in growing if j.queue == q]
        split = water_fill({j.id: sizes[j.id] for j in members}, {j.id: j.max_np for j in members},
                           {j.id: 1.0 for j in members}, shares[q] - held[q])
        sizes.update(split)
    return sizes


SIZERS: dict[str, Callable[[list[JobAsk], int, Mapping[str, int], Settings], Sizes]] = {
    "fifo": fifo, "priority": priority, "fair": fair}
