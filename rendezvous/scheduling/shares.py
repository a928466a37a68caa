"""Weighted max-min fairness on whole slots ("progressive filling"): slots go one at a time to
whoever holds the least per unit of weight, until each holds its cap or none are left.

Used twice by the `fair` policy: between queues (weights from --queue-weights) and between the
jobs of one queue (equal weights). Integer slots, so the result is the max-min fair allocation
up to one slot, with ties broken by the order of the keys (deterministic).
"""

from __future__ import annotations

import heapq
from typing import Hashable, Mapping, TypeVar

K = TypeVar("K", bound=Hashable)


def water_fill(base: Mapping[K, int], cap: Mapping[K, int], weight: Mapping[K, float], extra: int) -> dict[K, int]:
    """`base` raised by up to `extra` slots in all, each key to at most its `cap`: every slot to
    the key with the lowest allocation / weight (ties: the earlier key in `base`'s order).
    A key whose base already exceeds others' level just gets nothing more."""
    result = dict(base)
    order = {key: index for index, key in enumerate(base)}
    heap = [(result[k] / weight[k], order[k], k) for k in base if result[k] < cap[k] and weight[k] > 0]
    heapq.heapify(heap)
    while extra > 0 and heap:
        _, index, key = heapq.heappop(heap)
        result[key] += 1
        extra -= 1
        if result[key] < cap[key]:
            heapq.heappush(heap, (result[key] / weight[key], index, key))
    return result
