"""Starting a worker goes through one ordered list of ways: warm spare, template fork, cold
spare, fresh process; the first that gives a process wins, and the fresh process always can."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ringmaster.worker.agent.starting.spare_pool import SparePool
from ringmaster.worker.agent.starting.ways import (
    ColdSpare,
    FreshProcess,
    StartRequest,
    TemplateFork,
    WarmSpare,
    start_worker,
    ways_for,
)


class Gives:
    """A way that gives what it was made with (None: it cannot be this worker), and counts its calls."""

    def __init__(self, proc: object) -> None:
        self.proc, self.calls = proc, 0

    def start(self, request: StartRequest):
        self.calls += 1
        return self.proc


REQUEST = StartRequest([sys.executable, "-c", "print('up')"], dict(os.environ), "hostA/0")


def test_the_first_way_that_gives_a_process_wins_and_none_left_is_an_error() -> None:
    first, second, third = Gives(None), Gives("second's process"), Gives("third's process")
    assert start_worker([first, second, third], REQUEST) == "second's process"
    assert (first.calls, second.calls, third.calls) == (1, 1, 0)
    with pytest.raises(OSError, match="hostA/0"):
        start_worker([Gives(None)], REQUEST)


def test_the_agents_ways_are_warm_spare_template_cold_spare_fresh_in_that_order() -> None:
    said: list = []
    spares = SparePool(0, lambda: dict(os.environ), lambda proc, prefix: None, lambda kind, **f: said.append(kind))
    ways = ways_for(spares, lambda: None, lambda kind, **f: said.append(kind), lambda proc, prefix: None)
    assert [type(way) for way in ways] == [WarmSpare, TemplateFork, ColdSpare, FreshProcess]
    # No spare, no template (this agent forks none): the first three pass, the fresh process starts it.
    forwarded: list = []
    ways[-1] = FreshProcess(lambda proc, prefix: forwarded.append((proc, prefix)), spares.started_fresh)
    proc = start_worker(ways, REQUEST)
    assert isinstance(proc, subprocess.Popen) and forwarded == [(proc, ["[hostA/0] "])]
    out, _ = proc.communicate(timeout=60)
    assert out == b"up\n" and proc.returncode == 0 and said == []
