"""The job's Prometheus metrics (`GET /metrics`, text format 0.0.4, `prometheus_client`).

What the rendezvous knows is read when scraped (generation, world size, hosts by state, workers
by phase, committed steps, steps/s, store state, refused calls, discovery runs); what happened
is counted as the coordinator's events come (resets by cause, recovery times); what workers did
(commits, syncs, rollbacks, checkpoints, loss) comes with their heartbeats (`FigureTotals`).
Every name starts with `ringmaster_`; counters end in `_total`, durations are in seconds and
bytes in bytes, as Prometheus' conventions ask. One registry per job, never the global one.
"""

from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ringmaster.common.events import Event, Kind
from ringmaster.common.figures import FigureTotals, TimingTotal
from ringmaster.rendezvous.control.records import Phase, ResetCause
from ringmaster.rendezvous.control.view import JobView
from ringmaster.rendezvous.server.step_times import StepTimes

#: The content type of `GET /metrics`.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Seconds of committed steps over which steps/s is measured.
RATE_WINDOW_S = 30.0
#: Buckets of the recovery histogram (seconds from a failure seen to the first step after it).
RECOVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Kinds after which a worker's process is gone (its figures stay in the totals).
_DEPARTED = {Kind.WORKER_EXITED, Kind.WORKER_STOPPED, Kind.WORKER_FINISHED}


#: Generations the job's history keeps (the dashboard's strip); older ones are counted, not kept.
GENERATIONS_KEPT = 200


@dataclass
class GenerationEntry:
    """One generation as the dashboard shows it: when it formed (seconds since the epoch), why,
    when the last of its assignments left the rendezvous, and how long training took to resume
    after the failure that ended the one before."""

    number: int
    size: int
    cause: str
    causes: list[str]
    started: float
    recovery_s: float | None = None
    assigned_s: float | None = None  # from the failure seen (or its forming) to its last assignment handed over
    assigned_at: float | None = None  # when that was, seconds since the epoch


@dataclass
class DiscoveryStats:
    """Discovery runs and failed runs, counted by the poller."""

    runs: int = 0
    errors: int = 0


class JobMetrics:
    """The metrics of one job: feed it the coordinator's events (`on_event`), the workers'
    figures (`figures`), and render them (`render`)."""

    def __init__(self, view: Callable[[], JobView], refused_calls: Callable[[], int] = lambda: 0,
                 store_degraded: Callable[[], bool] = lambda: False, discovery: DiscoveryStats | None = None,
                 address: str = "", wall_clock: Callable[[], float] = time.time) -> None:
        """`view()`: the job as it is now (read at each scrape and for the rate of steps)."""
        self.view = view
        self.figures = FigureTotals()
        #: Step times by the job's size (the workers' heartbeats), for the pool's goodput policy.
        self.step_times = StepTimes()
        self.discovery = discovery or DiscoveryStats()
        self._refused_calls = refused_calls
        #: Workers' heartbeats taken, by who sent them: "worker" (its own call) or "agent" (relayed).
        self.heartbeats: Callable[[], dict[str, int]] = lambda: {}
        #: Workers' `Ready`s taken, by who sent them: "worker" (its own call) or "agent" (carried).
        self.readies: Callable[[], dict[str, int]] = lambda: {}
        #: Messages sent to workers, by the way they went: "stream" (the worker's own) or "agent" (carried).
        self.worker_messages: Callable[[], dict[str, int]] = lambda: {}
        self._store_degraded = store_degraded
        self._address = address
        self._steps: collections.deque[tuple[float, int]] = collections.deque()  # (time, committed steps)
        #: The newest generations, oldest first (GENERATIONS_KEPT at most).
        self.generations: collections.deque[GenerationEntry] = collections.deque(maxlen=GENERATIONS_KEPT)
        self._wall_clock = wall_clock
        self.registry = CollectorRegistry(auto_describe=True)
        self._resets = Counter("ringmaster_resets", "Generations that replaced the last one, by cause (a reset can "
                               "have several)", ["cause"], registry=self.registry)
        for cause in ResetCause:
            self._resets.labels(cause.value)  # every cause shows, at 0 until it happens
        self._recovery = Histogram("ringmaster_recovery_seconds", "From a failure seen by the rendezvous to rank 0's "
                                   "first commit after it", buckets=RECOVERY_BUCKETS, registry=self.registry)
        self._assigned = Histogram("ringmaster_assignments_out_seconds", "From a failure seen by the rendezvous "
                                   "(or, with none, a generation's forming) to the last of the new generation's "
                                   "assignments handed to its stream or agent", buckets=RECOVERY_BUCKETS,
                                   registry=self.registry)
        self._stragglers = Counter("ringmaster_stragglers_found", "Hosts found slower than the others' by the "
                                   "straggler check (once per host and generation)", registry=self.registry)
        self.registry.register(_Scraped(self))

    def on_event(self, event: Event) -> None:
        """Count what happened (the coordinator's `on_event` calls this for every event)."""
        if event.kind is Kind.GENERATION_FORMED:
            causes = [str(cause) for cause in event.fields.get("causes", ())]
            for cause in causes:
                self._resets.labels(cause).inc()
            self.generations.append(GenerationEntry(
                number=int(event.fields.get("number", 0)), size=int(event.fields.get("size", 0)),
                cause=str(event.fields.get("cause", "")), causes=causes, started=self._wall_clock()))
        elif event.kind is Kind.STRAGGLER_FOUND:
            self._stragglers.inc()
        elif event.kind is Kind.JOB_RECOVERED:
            seconds = float(event.fields.get("seconds", 0.0))
            self._recovery.observe(seconds)
            for entry in reversed(self.generations):
                if entry.number == event.fields.get("number"):
                    entry.recovery_s = seconds
                    break
        elif event.kind in _DEPARTED and "worker" in event.fields:
            self.figures.departed(str(event.fields["worker"]))
            self.step_times.departed(str(event.fields["worker"]))

    def assignments_out(self, number: int, seconds: float) -> None:
        """The last of generation `number`'s assignments was handed over, `seconds` after its change began."""
        self._assigned.observe(seconds)
        for entry in reversed(self.generations):
            if entry.number == number:
                entry.assigned_s, entry.assigned_at = seconds, self._wall_clock()
                break

    def steps_per_second(self, job: JobView | None = None) -> float:
        """Committed steps per second over the last RATE_WINDOW_S (0 with fewer than two samples).
        `job`: the view already built for this scrape (a view of a large job is not free)."""
        job = job if job is not None else self.view()
        now, steps = job.time, job.steps
        samples = self._steps
        if not samples or samples[-1][1] != steps or now - samples[-1][0] >= 1.0:
            if samples and steps < samples[-1][1]:
                samples.clear()  # a rollback or a restart from a checkpoint: the rate starts over
            samples.append((now, steps))
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return 0.0
        return (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])

    def host_slowdowns(self) -> dict[str, float]:
        """Each host of the current generation: its ranks' median pace (step time less waiting for
        the ring) over the other hosts' (1: as fast), as the newest straggler check measured it."""
        return self.step_times.slowdowns

    def scaling_hints(self) -> tuple[int, float]:
        """(batch per worker, gradient noise scale) as the job's script reported them (rank 0's,
        else any worker's; 0 where not reported)."""
        members = self.view().members
        hints = self.figures.hints
        if members and members[0][0] in hints:
            return hints[members[0][0]]
        return next(iter(hints.values()), (0, 0.0))

    def global_batch(self, job: JobView | None = None) -> tuple[int, int, int, dict[str, int]] | None:
        """The global batch the script declared, as rank 0 (else any worker) said it: (samples
        per step, per micro-batch, the most workers with something to compute, each live
        worker's micro-batches per step); None if none."""
        members = (job if job is not None else self.view()).members
        declared = self.figures.global_batches
        if not declared:
            return None
        size, micro, _, sharing = declared[members[0][0]] if members and members[0][0] in declared \
            else next(iter(declared.values()))
        shares = {worker: share for worker, (s, m, share, _) in sorted(declared.items()) if (s, m) == (size, micro)}
        return size, micro, size // micro * sharing, shares

    def loss(self, job: JobView | None = None) -> float | None:
        """Rank 0's last reported loss, else the median of the others'; None if none reported."""
        members = (job if job is not None else self.view()).members
        losses = self.figures.losses
        if members and members[0][0] in losses:
            return losses[members[0][0]]
        return statistics.median(losses.values()) if losses else None

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Scraped(Collector):
    """What is read from the job's view and the totals at each scrape."""

    def __init__(self, metrics: JobMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator:
        m = self.m
        job = m.view()
        yield GaugeMetricFamily("ringmaster_generation", "The current generation (0 before the first)",
                                value=job.generation)
        yield GaugeMetricFamily("ringmaster_world_size", "Workers in the current generation", value=job.world_size)
        if job.limit is not None:
            yield GaugeMetricFamily("ringmaster_target_workers", "The most workers wanted (--max-np or the scale "
                                                                 "target)",
                                    value=job.limit)
        hosts = GaugeMetricFamily("ringmaster_hosts", "Discovered hosts by state: active (a worker in the current "
                                  "generation), warming (workers starting), idle, draining (its workers leave at "
                                  "their next commit), drained, blacklisted, unreachable (no agent)",
                                  labels=["state"])
        for state, count in job.host_state_counts().items():
            hosts.add_metric([state], count)
        yield hosts
        workers = GaugeMetricFamily("ringmaster_workers", "Live worker processes by phase", labels=["phase"])
        phases = dict(job.worker_phases)
        for phase in Phase:
            workers.add_metric([phase.value], phases.get(phase.value, 0))
        yield workers
        drains = CounterMetricFamily("ringmaster_drains", "Finished drains by outcome: commit (its workers left at a "
                                     "commit), idle (it ran none), deadline (stopped; the others rolled back)",
                                     labels=["outcome"])
        done = dict(job.drains)
        for outcome in ("commit", "idle", "deadline"):
            drains.add_metric([outcome], done.get(outcome, 0))
        yield drains
        yield GaugeMetricFamily("ringmaster_committed_steps", "Rank 0's commits (goes back on a rollback)",
                                value=job.steps)
        yield GaugeMetricFamily("ringmaster_steps_per_second", "Committed steps per second over the last "
                                                               f"{RATE_WINDOW_S:g} s",
                                value=m.steps_per_second(job))
        slowdowns = GaugeMetricFamily("ringmaster_host_slowdown", "A host's ranks' median time per step besides "
                                      "waiting for the ring, over the other hosts' (1: as fast; a straggler is at "
                                      "--straggler-slowdown or more)", labels=["host"])
        for host, slowdown in sorted(m.host_slowdowns().items()):
            slowdowns.add_metric([host], slowdown)
        yield slowdowns
        loss = m.loss(job)
        if loss is not None:
            yield GaugeMetricFamily("ringmaster_loss", "The training loss last reported (hvd.report; rank 0's)",
                                    value=loss)
        totals = m.figures.totals
        yield CounterMetricFamily("ringmaster_commits", "Commits by all workers", value=totals.commits.count)
        yield _histogram("ringmaster_commit_seconds", "Time of one commit (snapshot and checkpoint hand-off)",
                         totals.commits)
        yield _histogram("ringmaster_sync_seconds", "Time of one state sync after a reset", totals.syncs)
        yield CounterMetricFamily("ringmaster_rollbacks", "Workers' restores to their last commit",
                                  value=totals.rollbacks)
        yield CounterMetricFamily("ringmaster_checkpoint_writes", "Durable checkpoints written",
                                  value=totals.checkpoints_written)
        yield CounterMetricFamily("ringmaster_checkpoint_failures", "Durable checkpoint writes that failed",
                                  value=totals.checkpoint_failures)
        yield CounterMetricFamily("ringmaster_checkpoint_bytes", "Tensor bytes of the durable checkpoints written",
                                  value=totals.checkpoint_bytes)
        yield CounterMetricFamily("ringmaster_discovery_runs", "Host discovery runs", value=m.discovery.runs)
        yield CounterMetricFamily("ringmaster_discovery_errors", "Host discovery runs that failed",
                                  value=m.discovery.errors)
        yield GaugeMetricFamily("ringmaster_store_degraded", "1 while the store is unreachable (training goes on)",
                                value=1 if m._store_degraded() else 0)
        leader = GaugeMetricFamily("ringmaster_leader_info", "The rendezvous that leads the job (this one)",
                                   labels=["address"])
        leader.add_metric([m._address], 1)
        yield leader
        yield CounterMetricFamily("ringmaster_refused_calls", "gRPC calls refused: no key proven, or a call the caller "
                                  "may not make",
                                  value=m._refused_calls())
        yield _by_via("ringmaster_worker_heartbeats", "Workers' heartbeats taken, by who sent them: the worker itself, "
                      "or its agent carrying it (a large job's, or --heartbeat-relay always)", m.heartbeats())
        yield _by_via("ringmaster_worker_ready", "Workers' Ready requests taken, by who sent them: the worker itself, "
                      "or its agent carrying the host's together (when it relays their heartbeats)", m.readies())
        yield _by_via("ringmaster_worker_messages", "Messages sent to workers (assignments, generation ends, host "
                      "updates, ...), by the way they went: the worker's own stream, or its agent carrying the host's "
                      "in one message (a large job's)", m.worker_messages())


def _by_via(name: str, documentation: str, counts: dict[str, int]) -> CounterMetricFamily:
    """A counter by the way things went (`via`: a worker's own call or stream, or its agent)."""
    family = CounterMetricFamily(name, documentation, labels=["via"])
    for via, count in sorted(counts.items()):
        family.add_metric([via], count)
    return family


def _histogram(name: str, documentation: str, timing: TimingTotal) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, buckets=[(b, float(c)) for b, c in timing.cumulative()],
                                 sum_value=timing.seconds)
