"""Sizers that look at what jobs have done, not only at what they asked: `goodput` (each slot to the
job that gains most from it, from its measured scaling) and `las` (least attained service first,
Tiresias' discipline, elastic).

- `goodput`: jobs are admitted at their minimums in submission order (as `fifo`), except that a
  job past `preempt_after_slot_s` of service comes after all the others (a new job starts in its
  place; it resumes from its last commit when slots come back); what is left goes, a few slots at
  a time, to the job whose predicted speedup (throughput times statistical efficiency over its
  rate at one worker, `throughput.Scaling`) gains most per slot, under a p-norm of speedups
  (`fairness_power`: 1 sums them; Pollux's -1 favours the jobs that gain least), each job's gains
  discounted as its attained service grows (half at `service_half_s` slot-seconds: short jobs
  first, as least attained service does, which is most of what lowers average completion time).
  Jobs past `las_threshold_slot_s` (Tiresias' second queue) grow one after another: each one's
  gains count a fifth of the one submitted before it, so the oldest long job gets the slots that
  pay and finishes, instead of all long jobs sharing the pool evenly and all finishing late (on
  Pollux's workload 1 at twice the load, 11 ImageNet jobs of 320 made more than half of the summed
  completion times). A job is sized where its measured scaling is trusted (up to `explore_factor`
  times the largest size it ran), and a running job's resize is counted against it: over the next
  `min_resize_interval_s` it trains `resize_cost_s` less at any other size, so a slot moves only
  where the gain outweighs both jobs' pause. Increments may be several slots (a job whose next
  host only pays off with several workers on it is not stuck at a host's edge).
- `las`: jobs below `las_threshold_slot_s` of attained slot-seconds come first, then the others,
  each queue in submission order; minimums in that order (a running job behind is suspended for
  one ahead, as `priority` does), leftovers in that order.

Pure, as the other sizers: jobs, what is left and the fixed sizes in, a size per job out.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ringmaster.rendezvous.scheduling.gang import Sizes, admit, grow_in_order, start_sizes
from ringmaster.rendezvous.scheduling.model import JobAsk, Settings
from ringmaster.rendezvous.scheduling.resources import Left

#: A gain in the objective below this is no gain (no resize for rounding noise).
_NO_GAIN = 1e-6
#: Each long job's gains relative to those of the long job submitted before it.
_LONG_JOB_DECAY = 0.2


def _utility(speedup: np.ndarray, power: float) -> np.ndarray:
    s = np.maximum(speedup, 1e-9)
    if abs(power) < 1e-9:
        return np.log(s)
    return np.power(s, power) / power


def trusted_size(job: JobAsk, settings: Settings) -> int:
    """The largest size `goodput` may give `job`: its `--max-np`, and no more than
    `explore_factor` times what it has been measured at (its current size where it has no
    measurement yet)."""
    explored = job.scaling.explored if job.scaling is not None else max(job.size, job.min_np)
    return max(job.min_np, job.whole(min(job.max_np, math.ceil(settings.explore_factor * explored))))


def value_curve(job: JobAsk, most: int, settings: Settings) -> np.ndarray:
    """The objective's value of `job` at 0..most workers over the next interval (index: size):
    its speedup under the p-norm, less the pause a resize costs a running job."""
    if job.scaling is not None:
        speedups = job.scaling.speedups(most, settings.host_slots)
    else:
        speedups = np.arange(most + 1, dtype=float)  # unmeasured: assumed linear (explored step by step)
    if job.running and settings.min_resize_interval_s > 0:
        cost = job.pause_s(settings.resize_cost_s)
        kept = max(0.0, 1.0 - cost / settings.min_resize_interval_s)
        speedups = speedups * kept
        if job.size <= most:
            speedups[job.size] /= max(kept, 1e-9)
    values = _utility(speedups, settings.fairness_power)
    if settings.service_half_s > 0:
        values = values / (1.0 + job.attained_s / settings.service_half_s)
    values[0] = -math.inf
    return values


def _best_step(values: np.ndarray, size: int, room: int, group: int = 1) -> tuple[float, int]:
    """The best gain per slot from `size` to any larger size within `room` more, and that size
    (sizes `group` apart: a job of replica groups grows by whole groups)."""
    top = min(len(values) - 1, size + room)
    if top < size + group:
        return -math.inf, size
    more = np.arange(group, top - size + 1, group)
    gains = (values[size + more] - values[size]) / more
    best = int(np.argmax(gains))
    return float(gains[best]), size + int(more[best])


def goodput(jobs: list[JobAsk], left: Left, fixed: Mapping[str, int], settings: Settings) -> Sizes:
    sizes = start_sizes(jobs, left, fixed)
    admit(goodput_order(jobs, settings), left, sizes)
    by_arrival = sorted(jobs, key=lambda j: (j.submitted, j.id))
    growing = [j for j in by_arrival if sizes[j.id] > 0 and j.id not in fixed]
    curves = {j.id: value_curve(j, trusted_size(j, settings), settings) for j in growing}
    long_jobs = [j for j in growing if j.attained_s >= settings.las_threshold_slot_s]
    for rank, job in enumerate(long_jobs):
        curves[job.id] = curves[job.id] * _LONG_JOB_DECAY ** rank
    while growing:
        best_gain, best_job, best_size = _NO_GAIN, None, 0
        for job in growing:
            gain, size = _best_step(curves[job.id], sizes[job.id], left.room(job.demand), job.group_size)
            if gain > best_gain:
                best_gain, best_job, best_size = gain, job, size
        if best_job is None:
            break
        left.take(best_job.demand, best_size - sizes[best_job.id])
        sizes[best_job.id] = best_size
    return sizes


def goodput_order(jobs: list[JobAsk], settings: Settings) -> list[JobAsk]:
    """`goodput`'s precedence for minimums: jobs in submission order, those past
    `preempt_after_slot_s` of service after all the others."""
    def long(job: JobAsk) -> bool:
        return settings.preempt_after_slot_s > 0 and job.attained_s >= settings.preempt_after_slot_s
    return sorted(jobs, key=lambda j: (long(j), j.submitted, j.id))


def las(jobs: list[JobAsk], left: Left, fixed: Mapping[str, int], settings: Settings) -> Sizes:
    sizes = start_sizes(jobs, left, fixed)
    by_id = {j.id: j for j in jobs}
    ordered = [by_id[job_id] for job_id in las_order(jobs, settings)]
    admit(ordered, left, sizes)
    grow_in_order(ordered, sizes, fixed, left)
    return sizes


def las_order(jobs: list[JobAsk], settings: Settings) -> list[str]:
    """`las`' precedence (placement and the stability rule follow it)."""
    return [j.id for j in sorted(jobs,
                                 key=lambda j: (j.attained_s >= settings.las_threshold_slot_s, j.submitted, j.id))]
