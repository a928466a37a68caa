"""The rendezvous' clock plans its next run from what the last one cost the loop's CPU
(`app.run_clock`): a run that was stopped midway (SIGSTOP, swapped out, starved) did not cost the
stop, so the clock keeps its pace, and the gap the stop left is seen as a stall."""

from __future__ import annotations

import time

from ringmaster.rendezvous.server.app import TICK_DUTY, TICK_S, run_clock


def test_a_run_stopped_midway_does_not_push_the_next_run_away() -> None:
    # (a sleep stands for the stop: the loop's thread is off the CPU, as under SIGSTOP)
    assert run_clock(lambda: time.sleep(0.5)) == TICK_S


def test_a_run_that_works_long_spaces_the_next_by_its_cost() -> None:
    def work() -> None:
        started = time.thread_time()
        while time.thread_time() - started < 0.05:
            pass

    assert run_clock(work) >= TICK_DUTY * 0.05
