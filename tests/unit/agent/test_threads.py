"""A worker's intra-op threads where its user set none: its share of the machine's cores when its
agent runs several workers, one on an emulated host, torch's own default when it is alone, and
the user's OMP_NUM_THREADS whenever it is set."""

from __future__ import annotations

import pytest

from ringmaster.worker.agent.starting.threads import applicable_threads, usable_cpus, worker_threads


@pytest.mark.parametrize("workers, cpus, threads", [(1, 16, None), (2, 16, "8"), (3, 16, "5"), (4, 2, "1"), (8, 2, "1"),
                                                    (2, 1, "1"), (0, 8, None)])
def test_several_workers_share_their_machines_cores(workers, cpus, threads) -> None:
    assert worker_threads({}, workers, cpus) == threads


def test_the_users_count_always_stands() -> None:
    for environ in ({"OMP_NUM_THREADS": "4"}, {"OMP_NUM_THREADS": "4", "RINGMASTER_SHARED_MACHINE": "1"},
                    {"OMP_NUM_THREADS": "2,1"}):
        assert worker_threads(environ, 4, 16) is None
    assert worker_threads({"OMP_NUM_THREADS": " "}, 4, 16) == "4"  # blank: not set


def test_an_emulated_host_gives_each_worker_one_thread_even_alone() -> None:
    """Its agent cannot know how many other emulated hosts share the cores."""
    assert worker_threads({"RINGMASTER_SHARED_MACHINE": "1"}, 1, 16) == "1"
    assert worker_threads({"RINGMASTER_SHARED_MACHINE": "0"}, 1, 16) is None


@pytest.mark.parametrize("value, count", [("1", 1), (" 8 ", 8), ("4096", 4096), ("0", None), ("4097", None),
                                          ("2,1", None), ("-1", None), ("", None), (None, None), ("x", None)])
def test_a_spare_applies_only_a_plain_positive_count(value, count) -> None:
    assert applicable_threads(value) == count


def test_the_usable_cpus_are_this_process_affinity() -> None:
    import os

    assert usable_cpus() == len(os.sched_getaffinity(0))
