"""One scheduling round: each job's target placement under a policy, with the pool's rules on
top of the policy's sizes.

- Gang: a job runs with at least `--min-np` workers or not at all (the sizers admit whole
  minimums only).
- Stability: a running job resized less than `--min-resize-interval` ago keeps its size (the
  interval counts from when it took the size, and a resize not yet taken holds it too), unless a
  host under it failed (`urgent`) or its slots are needed to start a job (a job of higher
  precedence: earlier under `fifo`, higher under `priority`, a queue below its share under `fair`).
  Such a job is fixed at its size and the policy asked again, until nothing held is changed.
- Placement: as few hosts as possible, running workers not moved (`placement.place`); where
  workers ask for GPUs or CPUs, on hosts where those are free (a job that cannot be placed at its
  minimum waits, with that reason).

Pure: `schedule(policy, hosts, jobs, now, settings)` returns a `Verdict` per job, with the reason
an operator sees. The pool service acts on it (at each job's next commit); the trace simulator
feeds it simulated time.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Sequence

from ringmaster.rendezvous.scheduling.adaptive import goodput_order, las_order
from ringmaster.rendezvous.scheduling.model import JobAsk, Settings, Verdict
from ringmaster.rendezvous.scheduling.placement import place
from ringmaster.rendezvous.scheduling.resources import Left
from ringmaster.rendezvous.scheduling.sizing import POLICIES, SIZERS, Sizes

#: How much more a move must be predicted to train, over the next interval, than staying put
#: (a margin for the model's error: a move on a near tie is not worth its risk).
_PACK_MARGIN = 0.05


def _held(job: JobAsk, usable_size: int, now: float, settings: Settings) -> bool:
    """Whether the minimum interval holds `job` at its size: it runs whole (no host under it is
    gone) and has not yet taken its last resize or took it less than the interval ago."""
    if not job.running or job.urgent or usable_size != job.size:
        return False
    return job.settling or (job.resized_at is not None and now - job.resized_at < settings.min_resize_interval_s)


def _pays_to_pack(job: JobAsk, settings: Settings) -> bool:
    """Whether moving a running job's workers onto as few hosts as its size needs is predicted to
    gain more over the next interval than the move's pause costs (only a job whose scaling was
    measured: its model says how much crossing hosts slows its ring)."""
    spans, size = len(job.placement), job.size
    fewest = math.ceil(size / max(settings.host_slots, 1))
    if job.scaling is None or spans <= fewest:
        return False
    now_rate = float(job.scaling.throughput(size, spans))
    packed_rate = float(job.scaling.throughput(size, fewest))
    pause = job.pause_s(settings.resize_cost_s)
    interval = settings.min_resize_interval_s
    return packed_rate * max(interval - pause, 0.0) > now_rate * interval * (1.0 + _PACK_MARGIN)


def _precedence(policy: str, jobs: Sequence[JobAsk], settings: Settings) -> list[str]:
    if policy == "las":
        return las_order(list(jobs), settings)
    if policy == "goodput":
        return [j.id for j in goodput_order(list(jobs), settings)]
    if policy == "priority":
        return [j.id for j in sorted(jobs, key=lambda j: (-j.priority, not j.running, j.submitted, j.id))]
    return [j.id for j in sorted(jobs, key=lambda j: (not j.running, j.submitted, j.id))]


def target_sizes(policy: str, capacity: int, jobs: Sequence[JobAsk], may_hold: set[str], now: float,
                 settings: Settings, totals: Mapping[str, float] | None = None) -> tuple[Sizes, set[str]]:
    """The policy's sizes with the stability rule applied to the jobs in `may_hold` (each placed
    on usable hosts only), and the jobs it held. `totals`: the pool's resources besides slots."""
    if policy not in SIZERS:
        raise ValueError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
    fixed: dict[str, int] = {}
    held = [j for j in jobs if j.id in may_hold]
    while True:
        sizes = SIZERS[policy](list(jobs), Left(capacity, totals), fixed, settings)
        starts = any(sizes[j.id] > 0 and not j.running for j in jobs)
        moved = [
            j for j in held if j.id not in fixed and sizes[j.id] != j.size and not (starts and sizes[j.id] < j.size)
        ]
        if not moved:
            return sizes, {j.id for j in held if j.id in fixed}
        for job in moved:
            fixed[job.id] = job.size


def _reason(job: JobAsk, size: int, now: float, held: bool, unclaimed: int, policy: str) -> str:
    if size == 0:
        if job.running:
            return (f"suspended: its {job.min_np} slot minimum went to jobs of higher precedence ({policy}); it "
                    "resumes from its last commit when slots come back")
        return (f"waiting: needs {job.min_np} slots together (--min-np); {max(unclaimed, 0)} are not held as the "
                f"minimum of a job ahead of it ({policy})")
    if not job.running:
        return f"starts on {size} slot(s)"
    if held and job.settling:
        return f"held at {size}: resized, and not yet trained at that size (it moves at its next commit)"
    if held:
        return (f"held at {size}: resized {now - (job.resized_at or now):.0f} s ago, under --min-resize-interval")
    if size > job.size:
        return f"grows to {size} with slots left over"
    if size < job.size and policy == "goodput":
        return f"shrinks to {size}: its slots speed other jobs up more than they speed it (goodput)"
    if size < job.size:
        return f"shrinks to {size}: its slots go to jobs of higher precedence ({policy}) or a host is gone"
    return f"running on {size} slot(s)"


def schedule(policy: str, hosts: Mapping[str, int], jobs: Sequence[JobAsk], now: float,
             settings: Settings | None = None, resources: Mapping[str, Mapping[str, float]] | None = None
             ) -> dict[str, Verdict]:
    """Each job's target under `policy` (one of `sizing.POLICIES`). `hosts`: the pool's usable
    hosts (blacklisted, drained and lost ones left out) with their slots; `resources`: what each
    declares besides (GPUs, CPUs), which jobs' `demand` is taken from."""
    settings = replace(settings or Settings(), host_slots=max(hosts.values(), default=1))
    resources = {h: dict(r) for h, r in (resources or {}).items() if h in hosts}
    totals: dict[str, float] = {}
    for declared in resources.values():
        for name, amount in declared.items():
            totals[name] = totals.get(name, 0.0) + amount
    if len({j.id for j in jobs}) != len(jobs):
        raise ValueError("job ids must be unique")
    capacity = sum(hosts.values())
    usable = {j.id: {h: n for h, n in j.placement.items() if h in hosts} for j in jobs}
    held_now = {j.id for j in jobs if _held(j, sum(usable[j.id].values()), now, settings)}
    # What runs is what is on usable hosts, and only at its minimum or more: a job that lost
    # hosts below its --min-np waits like any other (and, let in again, keeps what it has left).
    jobs = [replace(j, placement=usable[j.id] if sum(usable[j.id].values()) >= j.min_np else {}) for j in jobs]
    sizes, held = target_sizes(policy, capacity, jobs, held_now, now, settings, totals)
    order = _precedence(policy, jobs, settings)
    repack = {j.id for j in jobs if j.id not in held_now and sizes[j.id] == j.size and _pays_to_pack(j, settings)}
    placements = place(hosts, usable, sizes, order, {j.id: j.demand for j in jobs}, resources, repack,
                       {j.id: j.group_size for j in jobs})
    claimed = sum(sizes[j.id] if j.id in held else j.min_np for j in jobs if sizes[j.id] > 0)
    verdicts = {}
    for j in jobs:
        placed = sum(placements[j.id].values())
        if placed < sizes[j.id] and placed < j.min_np:  # its workers' resources do not fit together on hosts
            verdicts[j.id] = Verdict(j.id, {}, f"waiting: its {j.min_np} workers, each with {_asks(j)}, do not fit "
                                               "together on the hosts' free resources")
        elif j.id in repack and placements[j.id] != dict(j.placement):
            verdicts[j.id] = Verdict(j.id, placements[j.id],
                                     f"moves onto {len(placements[j.id])} host(s) from {len(j.placement)}: its "
                                     "measured scaling says a ring across fewer hosts pays for the pause")
        else:
            verdicts[j.id] = Verdict(j.id, placements[j.id],
                                     _reason(j, placed, now, j.id in held, capacity - claimed, policy))
    return verdicts


def _asks(job: JobAsk) -> str:
    return ", ".join([f"{amount:g} {name}" for name, amount in job.demand.items() if amount] + ["a slot"])
