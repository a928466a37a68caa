"""The rendezvous' step times by size: deltas of the workers' cumulative figures, counted under
the generation's (hosts, workers); figures that go back or straddle a generation are not counted;
a size counts as measured only after enough steps."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ringmaster.common.figures import FigureTotals, WorkerFigures, check_stats
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.server.step_times import MIN_STEPS, StepTimes


def _stats(steps: int, seconds: float, waited: float) -> pb.WorkerStats:
    return pb.WorkerStats(steps=pb.Timing(count=steps, seconds=seconds), wait_seconds=waited)


def test_steps_are_counted_by_the_size_of_the_ring_they_ran_in() -> None:
    times = StepTimes()
    for worker, host in (("w0", "a"), ("w1", "b")):
        times.update(worker, 3, host, (2, 2), _stats(0, 0.0, 0.0))  # the first heartbeat is the baseline
        times.update(worker, 3, host, (2, 2), _stats(10, 2.0, 0.5))
    [measured] = times.samples()
    assert (measured.hosts, measured.workers, measured.steps) == (2, 2, 10)
    assert measured.step_s == 0.2 and measured.compute_s == 0.15
    assert set(times.ranks) == {"w0", "w1"}


def test_figures_that_go_back_or_cross_a_generation_are_not_counted() -> None:
    times = StepTimes()
    times.update("w0", 1, "a", (1, 1), _stats(100, 10.0, 0.0))
    times.update("w0", 2, "a", (1, 2), _stats(200, 20.0, 0.0))  # new generation: a new baseline
    times.update("w0", 2, "a", (1, 2), _stats(150, 30.0, 0.0))  # went back: a new baseline
    times.update("w0", 2, None, (1, 2), _stats(300, 40.0, 0.0))  # not a member: not counted
    assert times.configs == {}


def test_a_size_is_measured_only_after_enough_steps() -> None:
    times = StepTimes()
    times.update("w0", 1, "a", (1, 1), _stats(0, 0.0, 0.0))
    times.update("w0", 1, "a", (1, 1), _stats(MIN_STEPS - 1, 1.0, 0.0))
    assert times.samples() == []
    times.update("w0", 1, "a", (1, 1), _stats(MIN_STEPS, 1.2, 0.0))
    assert len(times.samples()) == 1


def test_a_workers_step_figures_pass_the_check_and_bad_ones_are_refused() -> None:
    figures = WorkerFigures()
    figures.step(0.1, 0.02)
    figures.step(0.1, 5.0)  # (what it waited is part of its step: at most the step)
    assert check_stats(figures.stats()) == ""
    assert "waited" in check_stats(_stats(1, 0.1, 0.5)) or "ring" in check_stats(_stats(1, 0.1, 0.5))
    assert check_stats(_stats(1, 0.1, float("nan")))


def test_a_scripts_batch_and_noise_scale_reach_the_rendezvous_and_leave_with_the_worker() -> None:
    figures = WorkerFigures()
    figures.scaling_hints(32, 2000.0)
    stats = figures.stats()
    assert (stats.batch_size, stats.noise_scale) == (32, 2000.0) and check_stats(stats) == ""
    totals = FigureTotals()
    totals.update("w0", stats)
    assert totals.hints == {"w0": (32, 2000.0)}
    totals.departed("w0")
    assert totals.hints == {}
    assert "noise scale" in check_stats(pb.WorkerStats(noise_scale=float("inf")))
    assert "noise scale" in check_stats(pb.WorkerStats(batch_size=-1))


@settings(max_examples=200, deadline=None)
@given(beats=st.lists(st.tuples(st.integers(1, 40), st.floats(0.001, 5.0), st.floats(0.0, 1.0)), min_size=1,
                      max_size=60),
       window=st.integers(5, 300))
def test_a_workers_pace_is_its_newest_whole_heartbeats_that_hold_the_window(beats, window) -> None:
    """The running window equals the newest heartbeats taken one by one until `window` steps."""
    times = StepTimes(window_steps=window)
    times.update("w0", 1, "a", (1, 1), _stats(0, 0.0, 0.0))
    steps = seconds = waited = 0.0
    for n, s, w in beats:
        steps, seconds, waited = steps + n, seconds + s, waited + s * w
        times.update("w0", 1, "a", (1, 1), _stats(int(steps), seconds, waited))
    expected_steps, expected_s = 0, 0.0
    for n, s, _ in reversed(beats):
        if expected_steps >= window:
            break
        expected_steps, expected_s = expected_steps + n, expected_s + s
    paces = times.paces()
    if expected_steps < window:
        assert paces == []
    else:
        [(worker, host, total)] = paces
        assert (worker, host, total.steps) == ("w0", "a", expected_steps)
        assert math.isclose(total.seconds, expected_s, rel_tol=1e-9, abs_tol=1e-9)


def test_a_window_longer_than_a_few_hundred_steps_is_measured() -> None:
    times = StepTimes(window_steps=1000)
    times.update("w0", 1, "a", (1, 1), _stats(0, 0.0, 0.0))
    for beat in range(1, 101):
        times.update("w0", 1, "a", (1, 1), _stats(beat * 10, beat * 1.0, 0.0))
    [(_, _, total)] = times.paces()
    assert total.steps == 1000 and math.isclose(total.step_s, 0.1)
    times.window_steps = 50  # another length: measured again
    assert times.paces() == []
