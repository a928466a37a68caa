"""A worker's figures, as its heartbeats carry them to the rendezvous for `GET /metrics`.

Worker side: `WorkerFigures` counts commits, syncs and rollbacks, times them in fixed buckets
(`SECONDS_BUCKETS`), and keeps the last reported loss; every heartbeat sends them whole
(cumulative: they never go back, so a lost heartbeat loses nothing). Rendezvous side:
`check_stats` refuses what no worker of this job would send (another bucket layout, negative
or non-finite values), and `FigureTotals` sums the workers' figures so that a job's counters
never go back either: a worker that leaves hands its last figures to the totals.
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, field

from ringmaster.proto import ringmaster_pb2 as pb

#: Upper bounds (seconds) of the duration buckets, shared by workers and the rendezvous.
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SLOTS = len(SECONDS_BUCKETS) + 1  # and one for longer ones
#: Largest count or byte total a heartbeat may claim (a bound, not a limit any job reaches).
_MAX_COUNT = 1 << 62
#: Largest batch per worker and gradient noise scale (samples) a worker may report.
MAX_BATCH, MAX_NOISE_SCALE = 1 << 31, 1e12


@dataclass
class _Timing:
    count: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * _SLOTS)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.seconds += seconds
        self.buckets[bisect.bisect_left(SECONDS_BUCKETS, seconds)] += 1

    def proto(self) -> pb.Timing:
        return pb.Timing(count=self.count, seconds=self.seconds, buckets=self.buckets)


class WorkerFigures:
    """What one worker did so far; written by the training thread, read by the heartbeat thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commits = _Timing()
        self._syncs = _Timing()
        self._rollbacks = 0
        self._loss: float | None = None
        self._steps = _Timing()
        self._waited = 0.0
        self._batch_size = 0
        self._noise_scale = 0.0
        # (samples per step, per micro-batch, this worker's micro-batches per step, workers per micro-batch)
        self._global_batch = (0, 0, 0, 0)
        self.checkpoints = lambda: (0, 0, 0)  # (written, failed, bytes): the state's writer sets it

    def commit(self, seconds: float) -> None:
        with self._lock:
            self._commits.add(seconds)

    def sync(self, seconds: float) -> None:
        with self._lock:
            self._syncs.add(seconds)

    def step(self, seconds: float, waited: float) -> None:
        """One training step of `seconds` (from the step before), `waited` of it for the ring."""
        with self._lock:
            self._steps.add(seconds)
            self._waited += min(max(waited, 0.0), seconds)

    def scaling_hints(self, batch_size: int | None, noise_scale: float | None) -> None:
        """What the script said of its batch per worker and gradient noise scale (None: unchanged)."""
        with self._lock:
            if batch_size is not None:
                self._batch_size = int(batch_size)
            if noise_scale is not None:
                self._noise_scale = float(noise_scale)

    def global_batch(self, size: int, micro: int, accumulation: int, sharing: int = 1) -> None:
        """The global batch the script declared and this worker's share of its steps in the
        current generation (said again at every reset); `sharing`: the workers that compute each
        micro-batch (a replica group's size where the batch is dealt to groups)."""
        with self._lock:
            self._global_batch = (int(size), int(micro), int(accumulation), int(sharing))

    def rollback(self) -> None:
        with self._lock:
            self._rollbacks += 1

    def report(self, loss: float) -> None:
        with self._lock:
            self._loss = float(loss)

    def stats(self) -> pb.WorkerStats:
        written, failed, nbytes = self.checkpoints()
        with self._lock:
            return pb.WorkerStats(
                commits=self._commits.proto(), syncs=self._syncs.proto(), rollbacks=self._rollbacks,
                checkpoints_written=written, checkpoint_failures=failed, checkpoint_bytes=nbytes,
                has_loss=self._loss is not None and math.isfinite(self._loss), loss=self._loss or 0.0,
                steps=self._steps.proto(), wait_seconds=self._waited, batch_size=self._batch_size,
                noise_scale=self._noise_scale, global_batch=self._global_batch[0], micro_batch=self._global_batch[1],
                accumulation=self._global_batch[2], sharing=self._global_batch[3],
            )


def check_stats(stats: pb.WorkerStats) -> str:
    """"" when `stats` could come from a worker of this job; otherwise what is wrong with it."""
    for name, timing in (("commits", stats.commits), ("syncs", stats.syncs), ("steps", stats.steps)):
        if len(timing.buckets) not in (0, _SLOTS):
            return f"{name} has {len(timing.buckets)} buckets, not {_SLOTS}"
        if not 0 <= timing.count <= _MAX_COUNT or any(not 0 <= b <= _MAX_COUNT for b in timing.buckets):
            return f"{name} has a count out of range"
        if not math.isfinite(timing.seconds) or timing.seconds < 0:
            return f"{name} has a duration that is negative or not finite"
    for name in ("rollbacks", "checkpoints_written", "checkpoint_failures", "checkpoint_bytes"):
        if not 0 <= getattr(stats, name) <= _MAX_COUNT:
            return f"{name} is out of range"
    if not math.isfinite(stats.wait_seconds) or not 0 <= stats.wait_seconds <= stats.steps.seconds + 1e-6:
        return "the time waited for the ring is negative, not finite, or longer than the steps"
    if (not 0 <= stats.batch_size <= MAX_BATCH
            or not (math.isfinite(stats.noise_scale) and 0 <= stats.noise_scale <= MAX_NOISE_SCALE)):
        return "the batch size or the gradient noise scale is out of range"
    if stats.has_loss and not math.isfinite(stats.loss):
        return "the loss is not finite"
    if stats.global_batch or stats.micro_batch or stats.accumulation:
        if not (0 < stats.micro_batch <= stats.global_batch <= MAX_BATCH and stats.global_batch % stats.micro_batch == 0
                and 0 <= stats.accumulation <= stats.global_batch // stats.micro_batch
                and 1 <= stats.sharing <= MAX_BATCH):
            return "the global batch, its micro-batch or this worker's share of it is out of range"
    return ""


@dataclass
class TimingTotal:
    count: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * _SLOTS)

    def add(self, timing: pb.Timing, sign: int = 1) -> None:
        self.count += sign * timing.count
        self.seconds += sign * timing.seconds
        for i, b in enumerate(timing.buckets):
            self.buckets[i] += sign * b

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus' cumulative buckets: (upper bound, count at or below it), +Inf last."""
        out, running = [], 0
        for bound, count in zip((*map(str, SECONDS_BUCKETS), "+Inf"), self.buckets):
            running += count
            out.append((bound, running))
        return out


@dataclass
class Totals:
    commits: TimingTotal = field(default_factory=TimingTotal)
    syncs: TimingTotal = field(default_factory=TimingTotal)
    rollbacks: int = 0
    checkpoints_written: int = 0
    checkpoint_failures: int = 0
    checkpoint_bytes: int = 0

    def add(self, stats: pb.WorkerStats, sign: int = 1) -> None:
        self.commits.add(stats.commits, sign)
        self.syncs.add(stats.syncs, sign)
        self.rollbacks += sign * stats.rollbacks
        self.checkpoints_written += sign * stats.checkpoints_written
        self.checkpoint_failures += sign * stats.checkpoint_failures
        self.checkpoint_bytes += sign * stats.checkpoint_bytes


class FigureTotals:
    """The job's figures: those of the workers that left, plus each live worker's latest.
    A worker's figures only grow (they are cumulative); one that would go back is ignored."""

    def __init__(self) -> None:
        self.totals = Totals()  # everything: departed workers and the latest of live ones
        self._latest: dict[str, pb.WorkerStats] = {}
        self.losses: dict[str, float] = {}
        #: What each live worker said of its batch and gradient noise scale (hvd.report).
        self.hints: dict[str, tuple[int, float]] = {}
        #: Each live worker's declared global batch: (samples per step, per micro-batch, its micro-batches per
        #: step, workers per micro-batch).
        self.global_batches: dict[str, tuple[int, int, int, int]] = {}

    def update(self, worker_id: str, stats: pb.WorkerStats) -> None:
        previous = self._latest.get(worker_id)
        if previous is not None and (stats.commits.count < previous.commits.count
                                     or stats.syncs.count < previous.syncs.count):
            return  # (out of order, or not this worker's)
        if previous is not None:
            self.totals.add(previous, -1)
        self.totals.add(stats)
        self._latest[worker_id] = stats
        if stats.batch_size or stats.noise_scale:
            self.hints[worker_id] = (int(stats.batch_size), float(stats.noise_scale))
        if stats.global_batch:
            self.global_batches[worker_id] = (int(stats.global_batch), int(stats.micro_batch), int(stats.accumulation),
                                              int(stats.sharing))
        if stats.has_loss:
            self.losses[worker_id] = stats.loss

    def departed(self, worker_id: str) -> None:
        """The worker is gone: its last figures stay in the totals, it is no longer tracked."""
        self._latest.pop(worker_id, None)
        self.losses.pop(worker_id, None)
        self.hints.pop(worker_id, None)
        self.global_batches.pop(worker_id, None)
