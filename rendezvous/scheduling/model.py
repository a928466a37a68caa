"""What a scheduling policy sees and says: the jobs (`JobAsk`), the pool's usable hosts and the
time in; each job's placement and the reason for it (`Verdict`) out.

Plain frozen dataclasses, no I/O: the pool service builds them from its records and the trace
simulator from its workload, so one policy code serves both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

#: The default queue of a job submitted without `--queue`.
DEFAULT_QUEUE = "default"


@dataclass(frozen=True)
class JobAsk:
    """One job as the policy sees it. `placement` is where its workers run now (slots per host;
    empty when it waits or is suspended). `resized_at` is when its size last changed (None: never
    started); `urgent` says it lost workers to a failed host since, which exempts it from the
    minimum interval between resizes."""

    id: str
    min_np: int
    max_np: int
    submitted: float
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    placement: Mapping[str, int] = field(default_factory=dict)
    resized_at: float | None = None
    urgent: bool = False
    #: What each worker takes besides its slot (`--gpus-per-worker`, `--cpus-per-worker`).
    demand: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.min_np <= self.max_np:
            raise ValueError(f"job {self.id}: min_np {self.min_np} and max_np {self.max_np} must satisfy "
                             "1 <= min_np <= max_np")
        if any(not 0 <= amount < float("inf") for amount in self.demand.values()):
            raise ValueError(f"job {self.id}: a demand is a finite amount, 0 or more, not {dict(self.demand)}")
        if any(n <= 0 for n in self.placement.values()):
            raise ValueError(f"job {self.id}: a placement holds only positive slot counts, not {dict(self.placement)}")

    @property
    def running(self) -> bool:
        return bool(self.placement)

    @property
    def size(self) -> int:
        return sum(self.placement.values())


@dataclass(frozen=True)
class Settings:
    """What an administrator tunes (`ringmaster pool serve` flags)."""

    #: A job is not resized again within this many seconds of its last resize, unless a host
    #: under it failed or a job of higher precedence needs its slots (--min-resize-interval).
    min_resize_interval_s: float = 60.0
    #: Weights of queues for the `fair` policy (--queue-weights); an unnamed queue weighs 1.
    queue_weights: Mapping[str, float] = field(default_factory=dict)

    def weight(self, queue: str) -> float:
        return float(self.queue_weights.get(queue, 1.0))


@dataclass(frozen=True)
class Verdict:
    """A job's target: where its workers should run (empty: not at all) and why, in words an
    operator reads in `ringmaster jobs` (the waiting reason) or in the event of a resize."""

    job: str
    placement: Mapping[str, int]
    reason: str

    @property
    def size(self) -> int:
        return sum(self.placement.values())
