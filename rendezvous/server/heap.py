"""Keeping Python's cyclic garbage collector off a large job's long-lived records.

A rendezvous of 32,768 workers holds a few million Python objects that live as long as their
generation (workers, sessions, their records). The collector's full passes look at all of them:
about 0.8 s each at 4,096 hosts x 8, and they come whenever the heap has grown by a quarter (a new
generation's records do that), so a host lost could wait a second or more behind one. Once a
generation has formed and its messages have gone out, what is alive is long-lived: `gc.freeze()`
moves it out of the collector's sight, and later passes look only at what came since.

Garbage in reference cycles that was frozen is not reclaimed until the next unfreeze, so every
`RECLAIM_EVERY` freezes (and before the first) the heap is unfrozen and collected once, at the
same quiet moment; and the collector's thresholds are raised (`THRESHOLDS`), since with little
left unfrozen Python would run a full pass at nearly every change. Small jobs (under
`MIN_WORKERS`) are left to the collector's defaults.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

#: Jobs with fewer workers keep the collector's defaults (their full passes take milliseconds).
MIN_WORKERS = 2_000
#: A full collection (unfreeze, collect, freeze) at every this many freezes, and at the first.
RECLAIM_EVERY = 8
#: The collector's thresholds for a large job (Python's: 700, 10, 10). With the long-lived heap
#: frozen, Python's full pass is due whenever what is not frozen grew by a quarter, which a
#: change's new records do at once (17 full passes, 6 s, over three host losses at 4,096 x 8);
#: with these, fewer and larger young passes and no full pass in the same three (measured).
THRESHOLDS = (10_000, 20, 100)


@dataclass
class LongLivedHeap:
    """Freezes the heap once per generation of a large job (see the module's doc)."""

    min_workers: int = MIN_WORKERS
    reclaim_every: int = RECLAIM_EVERY
    frozen_generation: int = 0
    freezes: int = 0
    #: What the last freeze cost (seconds) and whether it reclaimed. (Not how many objects it left
    #: frozen: `gc.get_freeze_count()` walks them all, 0.23 s of a 2,048 x 8 job's loop.)
    last: dict[str, float] = field(default_factory=dict)

    def wanted(self, workers: int) -> bool:
        """Whether a job of `workers` is large enough for freezes."""
        return workers >= self.min_workers

    def settled(self, generation: int, workers: int) -> bool:
        """Call when `generation` has formed and its messages are out; True when it froze."""
        if generation == self.frozen_generation or not self.wanted(workers):
            return False
        started = time.perf_counter()
        reclaim = self.freezes % self.reclaim_every == 0
        if reclaim:
            gc.set_threshold(*THRESHOLDS)
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)  # the young garbage, cheaply, before it is frozen
        gc.freeze()
        self.frozen_generation = generation
        self.freezes += 1
        self.last = {"seconds": time.perf_counter() - started, "reclaimed": float(reclaim)}
        return True
