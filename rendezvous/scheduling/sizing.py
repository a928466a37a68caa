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
  fairness and inside a queue equally between its jobs, so a queue's unused share is lent to
  others and taken back when it has work. What a queue "holds" is its dominant share (the
  largest fraction of any one resource of the pool: slots, GPUs, CPUs), so where workers ask
  for different resources this is dominant-resource fairness; on slots alone, max-min on slots.

`las` and `goodput` (which look at what jobs have done: service attained, speedup measured) are
in `adaptive`.

A job of replica groups (`--group-size K`: its model sharded inside each group) is given whole
groups only: its minimum is whole groups, and it grows K workers at a time.

`fixed` jobs (held by the minimum interval between resizes) keep their size and are counted
first. A job fits where the slots and every resource its workers ask for are left (`Left`).
Pure: the jobs, what the pool has and the fixed sizes in, a size per job out (0: not running).
"""

from __future__ import annotations

from typing import Callable, Mapping

from ringmaster.rendezvous.scheduling.adaptive import goodput, las
from ringmaster.rendezvous.scheduling.gang import Sizes, admit, grow_in_order, start_sizes
from ringmaster.rendezvous.scheduling.model import JobAsk, Settings
from ringmaster.rendezvous.scheduling.resources import Left, dominant_share, usage

POLICIES = ("fifo", "priority", "fair", "las", "goodput")


def fifo(jobs: list[JobAsk], left: Left, fixed: Mapping[str, int], settings: Settings) -> Sizes:
    sizes = start_sizes(jobs, left, fixed)
    by_arrival = sorted(jobs, key=lambda j: (j.submitted, j.id))
    admit([j for j in by_arrival if j.running], left, sizes)
    admit(by_arrival, left, sizes)
    grow_in_order(by_arrival, sizes, fixed, left)
    return sizes


def priority(jobs: list[JobAsk], left: Left, fixed: Mapping[str, int], settings: Settings) -> Sizes:
    sizes = start_sizes(jobs, left, fixed)
    admit(sorted(jobs, key=lambda j: (-j.priority, not j.running, j.submitted, j.id)), left, sizes)
    grow_in_order(sorted(jobs, key=lambda j: (-j.priority, j.submitted, j.id)), sizes, fixed, left)
    return sizes


def fair(jobs: list[JobAsk], left: Left, fixed: Mapping[str, int], settings: Settings) -> Sizes:
    sizes = start_sizes(jobs, left, fixed)
    by_arrival = sorted(jobs, key=lambda j: (j.submitted, j.id))
    admit([j for j in by_arrival if j.running], left, sizes)
    queues = sorted({j.queue for j in jobs})
    held: dict[str, dict[str, float]] = {q: {} for q in queues}

    def hold(job: JobAsk, workers: int) -> None:
        for name, amount in usage(job.demand, workers).items():
            held[job.queue][name] = held[job.queue].get(name, 0.0) + amount

    def level(queue: str) -> float:  # (rounded: equal shares reached by different sums tie)
        return round(dominant_share(held[queue], left.totals) / settings.weight(queue), 9)

    for job in jobs:
        if sizes.get(job.id, 0) > 0:
            hold(job, sizes[job.id])
    waiting = [j for j in by_arrival if j.id not in sizes]
    while waiting:  # admit from the queue that holds least per unit of weight, among jobs that fit
        fits = [j for j in waiting if left.room(j.demand) >= j.min_np]
        if not fits:
            break
        job = min(fits, key=lambda j: (level(j.queue), j.submitted, j.id))
        sizes[job.id] = job.min_np
        left.take(job.demand, job.min_np)
        hold(job, job.min_np)
        waiting.remove(job)
    for job in waiting:
        sizes[job.id] = 0
    # Progressive filling, one worker (one replica group) at a time: to the queue whose (dominant)
    # share per unit of weight is lowest, inside it to its smallest job; a queue none of whose jobs
    # can take one more is out. On slots alone this is weighted max-min fairness on slots.
    growing = {q: [j for j in by_arrival if j.queue == q and sizes[j.id] > 0 and j.id not in fixed] for q in queues}
    order = {q: i for i, q in enumerate(queues)}
    while True:
        open_queues = {q: [j for j in members if sizes[j.id] < j.max_np and left.room(j.demand) >= j.group_size]
                       for q, members in growing.items()}
        open_queues = {q: members for q, members in open_queues.items() if members}
        if not open_queues:
            return sizes
        queue = min(open_queues, key=lambda q: (level(q), order[q]))
        job = min(open_queues[queue], key=lambda j: sizes[j.id])
        sizes[job.id] += job.group_size
        left.take(job.demand, job.group_size)
        hold(job, job.group_size)


SIZERS: dict[str, Callable[[list[JobAsk], Left, Mapping[str, int], Settings], Sizes]] = {
    "fifo": fifo, "priority": priority, "fair": fair, "las": las, "goodput": goodput}
