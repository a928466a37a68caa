"""What a job looks like from outside, as one immutable value: the control layer builds it
(`job_view`), and every reader (the control API, the metrics, the progress line, the timeline)
reads it instead of the coordinator's records, which change under them.

Pure: built from the coordinator's parts at a given time.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringmaster.common.events import Event
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.records import JobOutcome

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
    hosts: tuple[HostView, ...]
    workers: tuple[WorkerView, ...]
    events: tuple[Event, ...]  # the newest the job keeps, oldest first
    events_dropped: int
    drains: tuple[tuple[str, int], ...] = ()  # (outcome, count) of finished drains

    @property
    def world_size(self) -> int:
        return len(self.members)

    def host_state_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(HOST_STATES, 0)
        for host in self.hosts:
            if host.state:
                counts[host.state] += 1
        return counts


def job_view(job: Job, pool: HostPool, now: float) -> JobView:
    gen = job.generation
    members = gen.member_set if gen else frozenset()
    ranks = {a.worker_id: a.rank for a in gen.members} if gen else {}
    live_on: dict[str, list[str]] = {}
    for w in job.workers.values():
        if w.live:
            live_on.setdefault(w.host, []).append(w.worker_id)
    hosts = []
    for h in pool.hosts.values():
        blacklisted = pool.is_blacklisted(h.name, now)
        state = ""
        if h.discovered:
            live = live_on.get(h.name, [])
            state = ("blacklisted" if blacklisted else "unreachable" if not h.agent_connected
                     else ("drained" if h.drain.done else "draining") if h.drain is not None
                     else "active" if any(i in members for i in live) else "warming" if live else "idle")
        drain = h.drain
        # (the pid of an agent that is gone is no agent's any more)
        hosts.append(HostView(h.name, h.slots, h.discovered, h.agent_connected, h.agent_pid if h.agent_connected else None,
                              blacklisted, state, f"{drain.source.value}: {drain.reason}" if drain is not None else "",
                              max(0.0, drain.deadline_at - now) if drain is not None and not drain.done else None))
    workers = tuple(
        WorkerView(w.worker_id, w.host, w.phase.value, w.live, ranks.get(w.worker_id) if w.live else None, w.pid,
                   w.commits, w.elastic, w.failed, w.done)
        for w in job.workers.values())
    outcome = job.outcome
    if outcome is not None:
        state = "succeeded" if outcome.success else "failed"
    else:
        state = "running" if gen else "starting"
    return JobView(
        time=now, state=state,
        message=outcome.message if outcome else (gen.cause if gen else "waiting for hosts"),
        outcome=outcome, generation=gen.number if gen else 0,
        members=tuple((a.worker_id, a.host) for a in gen.members) if gen else (),
        generation_formed_at=job.generation_formed_at, limit=job.limit, min_np=job.settings.min_np,
        max_np=job.settings.max_np, capacity=job.capacity(now), resets=job.summary.resets, steps=job.summary.steps,
        hosts=tuple(hosts), workers=workers, events=tuple(job.summary.events),
        events_dropped=job.summary.events_dropped, drains=tuple(sorted(job.summary.drains.items())),
    )
