"""The steps every sizer shares: start from the sizes held fixed, admit whole minimums (gang), grow
with what is left, in whole replica groups (`JobAsk.group_size`). Pure."""

from __future__ import annotations

from typing import Iterable, Mapping

from ringmaster.rendezvous.scheduling.model import JobAsk
from ringmaster.rendezvous.scheduling.resources import Left

Sizes = dict[str, int]


def admit(ordered: Iterable[JobAsk], left: Left, sizes: Sizes) -> None:
    """Give each job in `ordered` (not yet sized) its minimum while it fits."""
    for job in ordered:
        if job.id in sizes:
            continue
        if left.room(job.demand) >= job.min_np:
            sizes[job.id] = job.min_np
            left.take(job.demand, job.min_np)
        else:
            sizes[job.id] = 0


def grow_in_order(ordered: Iterable[JobAsk], sizes: Sizes, fixed: Mapping[str, int], left: Left) -> None:
    """Grow each job in `ordered` (running, not fixed) toward its maximum with what is left."""
    for job in ordered:
        if job.id in fixed or sizes[job.id] == 0:
            continue
        more = job.whole(min(job.max_np - sizes[job.id], left.room(job.demand)))
        if more > 0:
            sizes[job.id] += more
            left.take(job.demand, more)


def start_sizes(jobs: list[JobAsk], left: Left, fixed: Mapping[str, int]) -> Sizes:
    """The sizes a round starts from: the fixed ones, taken out of what is left."""
    sizes: Sizes = dict(fixed)
    for job in jobs:
        if job.id in fixed:
            left.take(job.demand, fixed[job.id])
    return sizes
