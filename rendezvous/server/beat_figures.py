"""What the workers' heartbeats carry besides their liveness: their figures (for the metrics),
their step times by size (for the pool's goodput policy and the straggler check) and their
timeline spans (--timeline). Each is kept only where it is wanted (None: not kept)."""

from __future__ import annotations

import time

from ringmaster.common.figures import FigureTotals, check_stats
from ringmaster.common.spans import MAX_SPANS_PER_HEARTBEAT
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.control.coordinator import Coordinator
from ringmaster.rendezvous.control.stragglers import Persistence, Straggler, find_stragglers
from ringmaster.rendezvous.server.step_times import StepTimes
from ringmaster.rendezvous.server.trace_file import JobTimeline

#: Seconds between two looks for stragglers (at a heartbeat, not on a timer of its own).
STRAGGLER_CHECK_S = 1.0
#: ... or at least this many times what the last check cost (it looks at every rank).
STRAGGLER_DUTY = 20.0


class BeatFigures:
    def __init__(self) -> None:
        self.figures: FigureTotals | None = None  # the workers' figures, where metrics are kept
        self.step_times: StepTimes | None = None  # the job's step times by size (the pool's goodput policy)
        self.timeline: JobTimeline | None = None  # the job's timeline (--timeline), fed by the workers' spans
        self._ring_shape: tuple[int, dict[str, str], tuple[int, int]] = (0, {}, (0, 0))
        self._stragglers_checked = 0.0  # (time.monotonic) of the last straggler check
        self._straggler_every = STRAGGLER_CHECK_S  # seconds between two checks
        self._straggler_watch = Persistence()  # hosts found slow in the last checks

    def take(self, coordinator: Coordinator, request: pb.WorkerHeartbeatRequest) -> list[Straggler]:
        """Keep what a worker's heartbeat carries (its figures when they have the shape a worker
        sends, from a live worker: an exited one's are in the totals already). Returns the hosts
        newly confirmed as stragglers."""
        worker = coordinator.workers.get(request.worker_id)
        found: list[Straggler] = []
        if self.figures is not None and request.HasField("stats") and worker is not None and worker.live \
                and not check_stats(request.stats):
            self.figures.update(request.worker_id, request.stats)
            if self.step_times is not None:
                found = self._time_steps(coordinator, request.worker_id, request.stats)
        if self.timeline is not None and request.spans and worker is not None \
                and len(request.spans) <= MAX_SPANS_PER_HEARTBEAT and 0 <= request.spans_dropped < (1 << 53):
            self.timeline.on_spans(request.worker_id, request.spans, request.spans_dropped)
        return found

    def _time_steps(self, coordinator: Coordinator, worker_id: str, stats: pb.WorkerStats) -> list[Straggler]:
        generation = coordinator.job.generation
        if generation is None or self.step_times is None:
            return []
        if self._ring_shape[0] != generation.number:  # (once per generation, not per heartbeat)
            self._straggler_watch.reset()
            hosts = {a.worker_id: a.host for a in generation.members}
            self._ring_shape = (generation.number, hosts, (len(set(hosts.values())), len(hosts)))
        _, hosts, config = self._ring_shape
        self.step_times.update(worker_id, generation.number, hosts.get(worker_id), config, stats)
        now = time.monotonic()
        if now - self._stragglers_checked < self._straggler_every or config[0] <= 1:
            return []
        self._stragglers_checked = now
        paces = [(host, total.compute_s) for _, host, total in self.step_times.paces()]
        every_host = find_stragglers(paces, slowdown=0.0)  # (each host's slowdown: the metrics show them)
        self.step_times.slowdowns = {s.host: s.slowdown for s in every_host}
        slowdown = coordinator.settings.straggler_slowdown
        found = self._straggler_watch.confirm([s for s in every_host if s.slowdown >= slowdown])
        # (a check looks at every rank: a large job's waits at least STRAGGLER_DUTY times its cost,
        # the cost of a check of the whole ring: after a new generation the first checks see the
        # few ranks heard from yet, and were one a second, each larger, through the change that
        # followed: 8% of the rendezvous while half of a 4,096 x 8 job left)
        whole = config[1] / max(len(self.step_times.ranks), 1)
        self._straggler_every = max(STRAGGLER_CHECK_S, STRAGGLER_DUTY * (time.monotonic() - now) * max(whole, 1.0))
        return found
