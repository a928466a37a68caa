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

#: Steps a configuration needs before its mean counts as a measurement.
MIN_STEPS = 5
#: Steps of each worker's newest pace kept (the straggler check looks at its last ones).
PACE_STEPS = 200


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


class StepTimes:
    """One job's step times, by configuration and, for its current generation, by worker."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int, float, float]] = {}  # worker -> (generation, steps, seconds, waited)
        self.configs: dict[tuple[int, int], StepTotal] = {}
        #: The current generation's workers: worker id -> (host, their newest steps in it, by heartbeat).
        self.ranks: dict[str, tuple[str, collections.deque[tuple[int, float, float]]]] = {}
        self._ranks_generation = 0

    def update(self, worker_id: str, generation: int, host: str | None, config: tuple[int, int],
               stats: pb.WorkerStats) -> None:
        """A heartbeat's figures from `worker_id` (stats already checked: `figures.check_stats`);
        `host`: where it runs as a member of `generation` (None: not a member), `config`: that
        generation's (hosts, workers)."""
        now = (generation, stats.steps.count, stats.steps.seconds, stats.wait_seconds)
        last = self._last.get(worker_id)
        self._last[worker_id] = now
        if last is None or host is None or last[0] != generation or now[1] < last[1] or now[2] < last[2] or now[3] < last[3]:
            return
        steps, seconds, waited = now[1] - last[1], now[2] - last[2], now[3] - last[3]
        if steps <= 0:
            return
        self.configs.setdefault(config, StepTotal()).add(steps, seconds, waited)
        if generation != self._ranks_generation:
            self.ranks.clear()
            self._ranks_generation = generation
        recent = self.ranks.setdefault(worker_id, (host, collections.deque()))[1]
        recent.append((steps, seconds, waited))
        while len(recent) > 1 and sum(n for n, _, _ in recent) - recent[0][0] >= PACE_STEPS:
            recent.popleft()

    def paces(self, steps: int) -> list[tuple[str, str, StepTotal]]:
        """Each worker of the current generation: (worker, host, its newest `steps` steps or a few
        more: whole heartbeats), where it has taken that many."""
        out = []
        for worker, (host, recent) in self.ranks.items():
            total = StepTotal()
            for n, seconds, waited in reversed(recent):
                if total.steps >= steps:
                    break
                total.add(n, seconds, waited)
            if total.steps >= steps:
                out.append((worker, host, total))
        return out

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
