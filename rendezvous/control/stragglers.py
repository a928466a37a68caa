"""Which host holds a job back: the rule that finds stragglers, and whether replacing one pays.

In a synchronous ring every rank's step takes as long as the slowest one's, so a slow host does
not show in step times; it shows in what each rank does besides waiting for the ring. A rank's
*pace* is its mean step time less the time it waited for the reduction (computing, loading
data). A host is a straggler when the median pace of its ranks over their last `steps` steps is
at least `slowdown` times the median pace of the ranks on the other hosts (the others wait for
it), in `DEFAULT_CHECKS` checks in a row (`Persistence`). A job on one host has nothing to
compare with: no straggler.

Replacing a straggler pays when a spare host can take its workers (the job keeps its size at the
others' pace), or when the job is faster without it even with fewer workers: with each worker's
batch kept (Horovod's way), the job's rate goes as workers / pace, so dropping k of n workers
whose pace is `slowdown` times the others' pays when slowdown > n / (n - k).
Pure: paces in, verdicts out.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Iterable

#: A host this many times slower than the others (median pace) is a straggler (--straggler-slowdown).
DEFAULT_SLOWDOWN = 1.2
#: Over each rank's last this many steps (--straggler-steps).
DEFAULT_STEPS = 50
#: Consecutive checks (one a second) that must find a host slow before it is called a straggler.
DEFAULT_CHECKS = 3


@dataclass(frozen=True)
class Straggler:
    host: str
    slowdown: float  # its ranks' median pace over the other hosts' ranks'
    pace_s: float  # its ranks' median pace (seconds per step)
    others_s: float  # the other hosts' ranks' median pace


def find_stragglers(paces: Iterable[tuple[str, float]], slowdown: float = DEFAULT_SLOWDOWN) -> list[Straggler]:
    """The straggling hosts among `paces` ((host, a rank's pace in seconds) per rank measured
    over enough steps), slowest first. The others' median is taken from one sorted list of every
    pace, less the host's own (`median_without`): O(n log n) for n ranks, not O(hosts x n)."""
    by_host: dict[str, list[float]] = {}
    for host, pace in paces:
        if pace > 0:
            by_host.setdefault(host, []).append(pace)
    everyone = sorted(p for ps in by_host.values() for p in ps)
    found = []
    for host, mine in by_host.items():
        mine.sort()
        rest = median_without(everyone, mine)
        if rest is None:
            continue
        pace = statistics.median(mine)
        if rest > 0 and pace >= slowdown * rest:
            found.append(Straggler(host, pace / rest, pace, rest))
    return sorted(found, key=lambda s: -s.slowdown)


def median_without(everyone: list[float], mine: list[float]) -> float | None:
    """The median of the sorted multiset `everyone` less the sorted multiset `mine` (a part of
    it), as `statistics.median` gives it; None when nothing is left."""
    left = len(everyone) - len(mine)
    if left <= 0:
        return None

    def nth(n: int) -> float:  # the n-th (from 0) of what is left: the first value with more than n left up to it
        low, high = 0, len(everyone) - 1
        while low < high:
            middle = (low + high) // 2
            value = everyone[middle]
            if bisect.bisect_right(everyone, value) - bisect.bisect_right(mine, value) > n:
                high = middle
            else:
                low = middle + 1
        return everyone[low]

    if left % 2:
        return nth(left // 2)
    return (nth(left // 2 - 1) + nth(left // 2)) / 2


class Persistence:
    """A host counts as a straggler only when found so in `checks` consecutive checks (one noisy
    window on a busy machine is not a slow host)."""

    def __init__(self, checks: int = 3) -> None:
        self.checks = checks
        self._seen: dict[str, int] = {}

    def confirm(self, found: list[Straggler]) -> list[Straggler]:
        """This check's finds; those found in the last `checks` checks in a row."""
        self._seen = {s.host: self._seen.get(s.host, 0) + 1 for s in found}
        return [s for s in found if self._seen[s.host] >= self.checks]

    def reset(self) -> None:
        self._seen.clear()


def replacing_pays(straggler: Straggler, workers: int, on_host: int, spare_slots: int) -> bool:
    """Whether the job is faster without `straggler`'s `on_host` workers (of its `workers`):
    a spare host takes them, or the job runs faster on the rest alone."""
    if on_host <= 0 or on_host >= workers:
        return spare_slots >= on_host > 0
    if spare_slots >= on_host:
        return True
    return straggler.slowdown > workers / (workers - on_host)
