"""What a scheduling policy sees and says: the jobs (`JobAsk`), the pool's usable hosts and the
time in; each job's placement and the reason for it (`Verdict`) out.

Plain frozen dataclasses, no I/O: the pool service builds them from its records and the trace
simulator from its workload, so one policy code serves both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ringmaster.rendezvous.scheduling.throughput import Scaling

#: The default queue of a job submitted without `--queue`.
DEFAULT_QUEUE = "default"


@dataclass(frozen=True)
class JobAsk:
    """One job as the policy sees it. `placement` is where its workers run now (slots per host;
    empty when it waits or is suspended). `resized_at` is when it took its size (None: never
    started); `settling` says the pool has resized it but it has not trained at the new size yet
    (its newcomers start, or its leavers go, at its next commit): it is held as if just resized,
    since a size it never trained at has not been measured. `urgent` says it lost workers to a
    failed host since (or its owner scaled it), which exempts it from the minimum interval
    between resizes."""

    id: str
    min_np: int
    max_np: int
    submitted: float
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    placement: Mapping[str, int] = field(default_factory=dict)
    resized_at: float | None = None
    urgent: bool = False
    settling: bool = False
    #: What each worker takes besides its slot (`--gpus-per-worker`, `--cpus-per-worker`).
    demand: Mapping[str, float] = field(default_factory=dict)
    #: Slot-seconds it has run so far (the `las` policy serves the least first).
    attained_s: float = 0.0
    #: How it speeds up with more workers, as measured so far (the `goodput` policy; None: not
    #: measured yet, so assumed linear up to twice its size).
    scaling: Scaling | None = None
    #: Seconds its workers pause when it is resized (measured; None: the pool's default).
    resize_cost_s: float | None = None
    #: Workers per replica group (`--group-size`): every size it is given is a whole number of
    #: groups (its model is sharded inside a group, so a part of one is no use to it).
    group_size: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_np <= self.max_np:
            raise ValueError(f"job {self.id}: min_np {self.min_np} and max_np {self.max_np} must satisfy "
                             "1 <= min_np <= max_np")
        if self.group_size < 1 or self.min_np % self.group_size or self.max_np % self.group_size:
            raise ValueError(f"job {self.id}: min_np {self.min_np} and max_np {self.max_np} must be whole numbers of "
                             f"groups of {self.group_size}")
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

    def whole(self, workers: int) -> int:
        """`workers` rounded down to whole groups: the most of them this job can use."""
        return max(workers, 0) - max(workers, 0) % self.group_size

    def pause_s(self, default: float) -> float:
        """Seconds a resize pauses it: as measured, else `default` (the pool's --resize-cost)."""
        return self.resize_cost_s if self.resize_cost_s is not None else default


@dataclass(frozen=True)
class Settings:
    """What an administrator tunes (`ringmaster pool serve` flags)."""

    #: A job is not resized again within this many seconds of its last resize, unless a host
    #: under it failed or a job of higher precedence needs its slots (--min-resize-interval).
    min_resize_interval_s: float = 60.0
    #: Weights of queues for the `fair` policy (--queue-weights); an unnamed queue weighs 1.
    queue_weights: Mapping[str, float] = field(default_factory=dict)
    #: `goodput`: seconds a resize pauses a job that has not measured its own (--resize-cost).
    resize_cost_s: float = 5.0
    #: `goodput`: the p of the p-norm of speedups maximised: 1 is their sum (the most work done),
    #: lower favours jobs that gain least (Pollux uses -1), 0 is the sum of their logarithms.
    fairness_power: float = -1.0
    #: `goodput`: how far past the largest size a job has run its predicted speedup is trusted (x).
    #: Pollux trusts 2x; on Pollux's workloads (bench/pool_sim.py) the fit predicted well from
    #: a few sizes and 2x cost 30% in average JCT on workload 6 (4,201 s against 3,167 s), so the
    #: default is in effect no bound.
    explore_factor: float = 100.0
    #: `goodput`: slot-seconds of attained service at which a job's gains count half as much as a
    #: new job's (short jobs first, as least-attained-service does; 0: all count the same).
    service_half_s: float = 3600.0
    #: `goodput`: slots of a typical host (how many hosts a size spans, packed); set per round.
    host_slots: int = 1
    #: `las`: slot-seconds after which a job drops to the second queue (Tiresias: 16 GPU-hours).
    #: `goodput` too: jobs past it grow one after another, in submission order (see adaptive).
    las_threshold_slot_s: float = 16 * 3600.0
    #: `goodput`: slot-seconds of service after which a running job gives up even its minimum to
    #: start a job that has had less (as Tiresias preempts long jobs for new ones: most jobs are
    #: short, and a short job queued behind long ones costs the average most); 0: never.
    preempt_after_slot_s: float = 4 * 3600.0

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
