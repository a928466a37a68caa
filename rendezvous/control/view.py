"""What a job looks like from outside, as one immutable value: the control layer builds it
(`job_view`), and every reader (the control API, the metrics, the progress line, the timeline)
reads it instead of the coordinator's records, which change under them.

Pure: built from the coordinator's parts at a given time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

from ringmaster.common.events import Event
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.records import JobOutcome, Phase

#: Host states, as the status and the metrics count them.
HOST_STATES = ("active", "warming", "idle", "draining", "drained", "blacklisted", "unreachable")


@dataclass(frozen=True)
class HostView:
    name: str
    slots: int
    discovered: bool
    agent_connected: bool
    agent_pid: int | None
    blacklisted: bool
    state: str  # one of HOST_STATES for a discovered host; "" otherwise
    drain: str = ""  # why it is drained (or being drained); "" when it is not
    drain_deadline_s: float | None = None  # seconds left for its workers to leave, while draining


@dataclass(frozen=True)
class WorkerView:
    worker_id: str
    host: str
    phase: str
    live: bool
    rank: int | None  # in the current generation, while live
    pid: int | None
    commits: int
    elastic: bool
    failed: str | None
    done: bool


#: Which of a job's hosts and workers a view lists: (offset, most). The counts and totals are
#: always of all of them; a reader that needs no rows (the metrics, a scale request) asks for
#: NO_ROWS, the control API's status for one page: a job of thousands of hosts costs each
#: reader what it shows, not a record per worker (0.12 s a view at 4,096 x 8).
Page = tuple[int, int]
ALL_ROWS: Page = (0, 1 << 62)
NO_ROWS: Page = (0, 0)


class ViewOf(Protocol):
    """Where a reader gets the job's view from: `view(page=...)`."""

    def __call__(self, page: Page = ALL_ROWS) -> JobView: ...


@dataclass(frozen=True)
class JobView:
    """The job at `time` (the control layer's clock)."""

    time: float
    state: str  # "starting", "running", "succeeded", "failed"
    message: str
    outcome: JobOutcome | None
    generation: int  # 0 before the first
    members: tuple[tuple[str, str], ...]  # (worker id, host) of the current generation, in rank order
    generation_formed_at: float
    limit: int | None  # --max-np, or the scale target if lower
    min_np: int
    max_np: int | None
    capacity: int  # the slots the job may use now, at most `limit`
    resets: int
    steps: int  # rank 0's committed steps
    hosts: tuple[HostView, ...]  # the page asked for (see `Page`), in the pool's order
    workers: tuple[WorkerView, ...]  # the page asked for, in the order they were started
    events: tuple[Event, ...]  # the newest the job keeps, oldest first
    events_dropped: int
    drains: tuple[tuple[str, int], ...] = ()  # (outcome, count) of finished drains
    hosts_total: int = 0
    workers_total: int = 0
    host_states: tuple[tuple[str, int], ...] = ()  # (state, discovered hosts in it), every HOST_STATES
    worker_phases: tuple[tuple[str, int], ...] = ()  # (phase, live workers in it), phases with any

    @property
    def world_size(self) -> int:
        return len(self.members)

    def host_state_counts(self) -> dict[str, int]:
        return dict(self.host_states)


def job_view(job: Job, pool: HostPool, now: float, page: Page = ALL_ROWS) -> JobView:
    """The job now, listing the hosts and workers of `page` (all by default)."""
    gen = job.generation
    members = gen.member_set if gen else frozenset()
    live_hosts: set[str] = set()
    active_hosts: set[str] = set()  # with a live member of the current generation
    phases: dict[Phase, int] = {}
    for w in job.workers.values():
        if w.live:
            live_hosts.add(w.host)
            phase = w.phase
            phases[phase] = phases.get(phase, 0) + 1
            if w.worker_id in members:
                active_hosts.add(w.host)
    offset, most = page
    shown = range(offset, offset + most)
    hosts = []
    counts = dict.fromkeys(HOST_STATES, 0)
    for i, h in enumerate(pool.hosts.values()):
        state = ""
        blacklisted = pool.is_blacklisted(h.name, now)
        if h.discovered:
            state = ("blacklisted" if blacklisted else "unreachable" if not h.agent_connected
                     else ("drained" if h.drain.done else "draining") if h.drain is not None
                     else "active" if h.name in active_hosts else "warming" if h.name in live_hosts else "idle")
            counts[state] += 1
        if i not in shown:
            continue
        drain = h.drain
        # (the pid of an agent that is gone is no agent's any more)
        hosts.append(HostView(h.name, h.slots, h.discovered, h.agent_connected,
                              h.agent_pid if h.agent_connected else None,
                              blacklisted, state, f"{drain.source.value}: {drain.reason}" if drain is not None else "",
                              max(0.0, drain.deadline_at - now) if drain is not None and not drain.done else None))
    ranks = gen.by_worker if gen else {}
    workers = tuple(
        WorkerView(w.worker_id, w.host, w.phase.value, w.live,
                   ranks[w.worker_id].rank if w.live and w.worker_id in ranks else None, w.pid,
                   w.commits, w.elastic, w.failed, w.done)
        for w in itertools.islice(job.workers.values(), offset, offset + most))
    outcome = job.outcome
    if outcome is not None:
        state = "succeeded" if outcome.success else "failed"
    else:
        state = "running" if gen else "starting"
    return JobView(
        time=now, state=state,
        message=outcome.message if outcome else (gen.cause if gen else "waiting for hosts"),
        outcome=outcome, generation=gen.number if gen else 0,
        members=gen.member_hosts if gen else (),
        generation_formed_at=job.generation_formed_at, limit=job.limit, min_np=job.settings.min_np,
        max_np=job.settings.max_np, capacity=job.capacity(now), resets=job.summary.resets, steps=job.summary.steps,
        hosts=tuple(hosts), workers=workers, events=tuple(job.summary.events),
        events_dropped=job.summary.events_dropped, drains=tuple(sorted(job.summary.drains.items())),
        hosts_total=len(pool.hosts), workers_total=len(job.workers), host_states=tuple(counts.items()),
        worker_phases=tuple((phase.value, n) for phase, n in phases.items()),
    )
