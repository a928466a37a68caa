"""What a worker takes besides its slot (GPUs, CPUs), and what is left of the pool to give.

A pool counts slots always, and other resources where its hosts declare them (a pool agent says
its GPUs and CPUs). A job asks, per worker, for some of them (`--gpus-per-worker 1
--cpus-per-worker 4`); a worker fits where every one of them is free. Without declared
resources everything reduces to slots, so the policies behave exactly as on slots alone.

`dominant_share` is the quantity dominant-resource fairness (Ghodsi et al., NSDI 2011) equalises:
the largest fraction of any one resource of the pool that a queue holds.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

from typing import Mapping

SLOTS = "slots"
GPU = "gpu"
#: What one worker of a job takes besides its slot, by resource name.
Demand = Mapping[str, float]
#: Resources the pool knows by name, besides slots (what `pool agent` declares, what `submit` asks for).
RESOURCES = ("gpu", "cpu")


def usage(demand: Demand, workers: int) -> dict[str, float]:
    """What `workers` workers of a job take: their slots and their demand."""
    used = {SLOTS: float(workers)}
    for name, amount in demand.items():
        used[name] = used.get(name, 0.0) + amount * workers
    return used


def room_in(free: Mapping[str, float], demand: Demand) -> int:
    """How many workers with `demand` fit in `free` (slots, and every resource they ask for;
    a resource `free` does not have fits none)."""
    fits = int(free.get(SLOTS, 0))
    for name, amount in demand.items():
        if amount > 0:
            fits = min(fits, int(free.get(name, 0.0) / amount + 1e-9))
    return max(fits, 0)


def dominant_share(used: Mapping[str, float], totals: Mapping[str, float]) -> float:
    """The largest fraction of one resource of the pool that `used` holds."""
    return max((used.get(name, 0.0) / total for name, total in totals.items() if total > 0), default=0.0)


class Left:
    """What is left of the pool to give out in one round of sizing."""

    def __init__(self, slots: int, totals: Mapping[str, float] | None = None) -> None:
        self.totals: dict[str, float] = {SLOTS: float(slots), **(totals or {})}
        self.free: dict[str, float] = dict(self.totals)

    def room(self, demand: Demand) -> int:
        return room_in(self.free, demand)

    def take(self, demand: Demand, workers: int) -> None:
        for name, amount in usage(demand, workers).items():
            self.free[name] = self.free.get(name, 0.0) - amount

    @property
    def slots(self) -> int:
        return int(self.free[SLOTS])
