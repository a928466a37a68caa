"""How long a job's steps take at each size it ran, from the step times its workers send with their
heartbeats (`WorkerStats.steps`, `wait_seconds`: cumulative, so a lost heartbeat loses nothing).

Each heartbeat adds the worker's steps since its last one to the configuration the job ran at
then: (hosts, workers) of its generation. The pool's `goodput` policy fits the job's scaling to
these (`samples`); the straggler check compares the ranks of the current generation (`ranks`).
A worker's figures that go back, or that straddle a new generation, start it over (not counted).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.control.stragglers import DEFAULT_STEPS

#: Steps a configuration needs before its mean counts as a measurement.
MIN_STEPS = 5


@dataclass
class StepTotal:
    """Steps, their seconds, and the seconds of them spent waiting for the ring."""

    steps: int = 0
    seconds: float = 0.0
    waited: float = 0.0

    def add(self, steps: int, seconds: float, waited: float) -> None:
        self.steps += steps
        self.seconds += seconds
        self.waited += waited

    @property
    def step_s(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0

    @property
    def compute_s(self) -> float:
        """Mean time of a step not spent waiting for the ring (computing, and loading data)."""
        return max(self.seconds - self.waited, 0.0) / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class Measured:
    """A configuration's mean step: `hosts` and `workers` of the ring, over `steps` steps."""

    hosts: int
    workers: int
    steps: int
    step_s: float
    compute_s: float


class PaceWindow:
    """One worker's newest steps: whole heartbeats, the fewest that hold the window's steps, and
    their running total (kept as heartbeats come, so reading every worker's pace costs nothing per
    heartbeat kept: the straggler check reads all of a large job's)."""

    __slots__ = ("host", "beats", "total")

    def __init__(self, host: str) -> None:
        self.host = host
        self.beats: collections.deque[tuple[int, float, float]] = collections.deque()
        self.total = StepTotal()

    def add(self, steps: int, seconds: float, waited: float, window: int) -> None:
        self.beats.append((steps, seconds, waited))
        self.total.add(steps, seconds, waited)
        while len(self.beats) > 1 and self.total.steps - self.beats[0][0] >= window:
            old = self.beats.popleft()
            self.total.add(-old[0], -old[1], -old[2])


class StepTimes:
    """One job's step times, by configuration and, for its current generation, by worker."""

    def __init__(self, window_steps: int = DEFAULT_STEPS) -> None:
        self._last: dict[str, tuple[int, int, float, float]] = {}  # worker -> (generation, steps, seconds, waited)
        self.configs: dict[tuple[int, int], StepTotal] = {}
        #: The current generation's workers: worker id -> their newest `window_steps` steps in it.
        self.ranks: dict[str, PaceWindow] = {}
        self._ranks_generation = 0
        self._window_steps = window_steps
        #: Each host's slowdown (its ranks' median pace over the other hosts'), as the newest
        #: straggler check found it: what the metrics show, not computed again per scrape.
        self.slowdowns: dict[str, float] = {}

    @property
    def window_steps(self) -> int:
        """Steps each worker's pace is taken over (the job's --straggler-steps)."""
        return self._window_steps

    @window_steps.setter
    def window_steps(self, steps: int) -> None:
        if steps != self._window_steps:
            self._window_steps = steps
            self.ranks.clear()  # (windows of another length: measured again)
            self.slowdowns = {}

    def update(self, worker_id: str, generation: int, host: str | None, config: tuple[int, int],
               stats: pb.WorkerStats) -> None:
        """A heartbeat's figures from `worker_id` (stats already checked: `figures.check_stats`);
        `host`: where it runs as a member of `generation` (None: not a member), `config`: that
        generation's (hosts, workers)."""
        now = (generation, stats.steps.count, stats.steps.seconds, stats.wait_seconds)
        last = self._last.get(worker_id)
        self._last[worker_id] = now
        if (last is None or host is None or last[0] != generation
                or now[1] < last[1] or now[2] < last[2] or now[3] < last[3]):
            return
        steps, seconds, waited = now[1] - last[1], now[2] - last[2], now[3] - last[3]
        if steps <= 0:
            return
        self.configs.setdefault(config, StepTotal()).add(steps, seconds, waited)
        if generation != self._ranks_generation:
            self.ranks.clear()
            self.slowdowns = {}
            self._ranks_generation = generation
        window = self.ranks.get(worker_id)
        if window is None:
            window = self.ranks[worker_id] = PaceWindow(host)
        window.add(steps, seconds, waited, self._window_steps)

    def paces(self) -> list[tuple[str, str, StepTotal]]:
        """Each worker of the current generation: (worker, host, its newest `window_steps` steps or
        a few more: whole heartbeats), where it has taken that many."""
        steps = self._window_steps
        return [(worker, window.host, window.total) for worker, window in self.ranks.items()
                if window.total.steps >= steps]

    def departed(self, worker_id: str) -> None:
        self._last.pop(worker_id, None)
        self.ranks.pop(worker_id, None)

    def samples(self) -> list[Measured]:
        """Every configuration measured over at least MIN_STEPS steps (per worker, on average)."""
        out = []
        for (hosts, workers), total in sorted(self.configs.items()):
            if total.steps >= MIN_STEPS * workers and total.step_s > 0:
                out.append(Measured(hosts, workers, total.steps // workers, total.step_s, total.compute_s))
        return out
