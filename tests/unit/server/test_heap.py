"""The large job's heap freeze (`LongLivedHeap`): what it freezes, when, and that garbage frozen in
a cycle is reclaimed at the next full pass. Real `gc` of this process, unfrozen after each test."""

from __future__ import annotations

import gc
import weakref
from typing import Iterator

import pytest

from ringmaster.rendezvous.server import heap as heap_module
from ringmaster.rendezvous.server.heap import LongLivedHeap


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_a_small_job_is_left_to_the_collector() -> None:
    heap = LongLivedHeap(min_workers=100)
    thresholds = gc.get_threshold()
    assert not heap.settled(generation=1, workers=99)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds


def test_a_large_job_is_frozen_once_per_generation() -> None:
    heap = LongLivedHeap(min_workers=100)
    kept = _Node()
    assert heap.settled(generation=1, workers=100)
    assert gc.get_freeze_count() > 0 and heap.last["seconds"] >= 0
    assert all(obj is not kept for obj in gc.get_objects())  # out of the collector's sight
    assert gc.get_threshold() == heap_module.THRESHOLDS
    assert not heap.settled(generation=1, workers=100)
    assert heap.settled(generation=2, workers=100)


def test_garbage_frozen_in_a_cycle_is_reclaimed_at_the_next_full_pass() -> None:
    heap = LongLivedHeap(min_workers=1, reclaim_every=2)
    assert heap.settled(generation=1, workers=1) and heap.last["reclaimed"] == 1.0
    cycle = _Node()
    gone = weakref.ref(cycle)
    gc.collect()  # (so it is old, not young garbage the freeze's own young pass would take)
    heap.settled(generation=2, workers=1)  # frozen alive ...
    del cycle
    gc.collect()
    assert gone() is not None  # ... so the collector cannot free it
    assert heap.settled(generation=3, workers=1) and heap.last["reclaimed"] == 1.0
    assert gone() is None
