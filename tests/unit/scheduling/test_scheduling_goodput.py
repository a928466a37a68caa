"""The `goodput` policy's parts: the step-time model's fit (recovers known parameters from noisy
samples and predicts sizes it never saw), the allocator (within min and max, never more slots
than exist, slots to the job that gains most, no resize without gain) and `las`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringmaster.rendezvous.scheduling.model import JobAsk, Settings
from ringmaster.rendezvous.scheduling.plan import schedule
from ringmaster.rendezvous.scheduling.throughput import PerfParams, Scaling, StepSample, fit, step_time

TRUE = PerfParams(compute_s=0.02, compute_per_sample_s=0.0006, host_sync_s=0.01, host_sync_per_worker_s=0.002,
                  net_sync_s=0.05, net_sync_per_worker_s=0.004, overlap=2.0)
HOSTS = {f"h{i}": 4 for i in range(4)}


def _samples(params: PerfParams, shapes: list[tuple[int, int]], batches: tuple[int, ...], noise: float,
             seed: int = 0, with_compute: bool = False) -> list[StepSample]:
    rng = np.random.default_rng(seed)
    out = []
    for hosts, workers in shapes:
        for batch in batches:
            step = float(step_time(params, hosts, workers, batch)) * float(np.exp(rng.normal(0, noise)))
            compute = params.compute_s + params.compute_per_sample_s * batch if with_compute else None
            out.append(StepSample(hosts, workers, batch, step, compute))
    return out


def test_the_fit_recovers_known_parameters_from_noisy_samples() -> None:
    samples = _samples(TRUE, [(1, 1), (1, 2), (1, 4), (2, 8), (3, 12), (4, 16)], (32, 64, 128), noise=0.02)
    fitted = fit(samples)
    assert fitted.compute_s == pytest.approx(TRUE.compute_s, rel=0.1)
    assert fitted.compute_per_sample_s == pytest.approx(TRUE.compute_per_sample_s, rel=0.1)
    assert fitted.net_sync_s == pytest.approx(TRUE.net_sync_s, rel=0.25)
    assert fitted.net_sync_per_worker_s == pytest.approx(TRUE.net_sync_per_worker_s, rel=0.25)
    for hosts, workers in [(1, 3), (2, 6), (6, 24), (16, 64)]:  # sizes never measured
        assert float(step_time(fitted, hosts, workers, 64)) == pytest.approx(float(step_time(TRUE, hosts, workers, 64)),
                                                                             rel=0.05)


def test_the_fit_uses_the_compute_time_workers_report() -> None:
    """With the compute part of each step known, few samples pin compute and sync apart."""
    samples = _samples(TRUE, [(1, 1), (1, 4), (2, 8)], (64,), noise=0.0, with_compute=True)
    fitted = fit(samples)
    assert fitted.compute_s + 64 * fitted.compute_per_sample_s == pytest.approx(TRUE.compute_s + 64 * TRUE.compute_per_sample_s,
                                                                                rel=0.02)


def test_a_job_never_run_across_hosts_is_not_predicted_faster_across_them() -> None:
    samples = _samples(TRUE, [(1, 1), (1, 2), (1, 4)], (64,), noise=0.01)
    fitted = fit(samples)
    assert float(step_time(fitted, 2, 8, 64)) >= float(step_time(fitted, 1, 8, 64)) * 0.999


def test_the_fit_and_samples_refuse_what_cannot_be_fit() -> None:
    with pytest.raises(ValueError, match="at least one"):
        fit([])
    with pytest.raises(ValueError, match="hosts <= workers"):
        StepSample(hosts=3, workers=2, local_batch=8, step_s=0.1)
    with pytest.raises(ValueError, match="positive step time"):
        StepSample(hosts=1, workers=1, local_batch=8, step_s=float("nan"))


def _scaling(sync_s: float, explored: int = 16) -> Scaling:
    """A job with 0.1 s of compute per step whose ring costs `sync_s` per step (per-worker batch kept)."""
    return Scaling(PerfParams(0.1, 0.0, sync_s, 0.0, sync_s, sync_s / 4, 1.0), batch=32, explored=explored)


def test_slots_go_to_the_job_that_scales() -> None:
    compute_bound = JobAsk("compute", 1, 16, submitted=0.0, scaling=_scaling(0.001))
    comm_bound = JobAsk("comm", 1, 16, submitted=0.0, scaling=_scaling(0.5))
    verdicts = schedule("goodput", HOSTS, [compute_bound, comm_bound], now=0.0, settings=Settings(fairness_power=1.0))
    assert verdicts["compute"].size > verdicts["comm"].size
    assert verdicts["compute"].size + verdicts["comm"].size <= 16


def test_no_slot_is_given_where_it_gains_nothing() -> None:
    """A job whose ring costs more than a worker adds stays at one worker; slots stay free."""
    flat = JobAsk("flat", 1, 16, submitted=0.0, scaling=_scaling(5.0))
    verdicts = schedule("goodput", HOSTS, [flat], now=0.0)
    assert verdicts["flat"].size == 1


def test_a_resize_must_gain_more_than_its_pause() -> None:
    """A running job that would gain a little from one more worker is not paused for it when the
    pause costs more than the gain over the next interval; with a cheap pause it grows."""
    running = {"h0": 4, "h1": 4, "h2": 3}
    job = JobAsk("j", 1, 12, submitted=0.0, placement=running, resized_at=-1000.0, scaling=_scaling(0.001))
    costly = Settings(min_resize_interval_s=60.0, resize_cost_s=30.0, fairness_power=1.0)
    assert schedule("goodput", HOSTS, [job], now=0.0, settings=costly)["j"].size == 11
    cheap = Settings(min_resize_interval_s=60.0, resize_cost_s=0.5, fairness_power=1.0)
    assert schedule("goodput", HOSTS, [job], now=0.0, settings=cheap)["j"].size == 12


def test_a_job_grows_only_as_far_as_it_was_measured_times_the_explore_factor() -> None:
    job = JobAsk("j", 1, 16, submitted=0.0, scaling=_scaling(0.001, explored=2))
    assert schedule("goodput", HOSTS, [job], now=0.0, settings=Settings(explore_factor=2.0))["j"].size == 4


@st.composite
def _jobs_with_scaling(draw):
    jobs = []
    for i in range(draw(st.integers(1, 6))):
        min_np = draw(st.integers(1, 6))
        scaling = None
        if draw(st.booleans()):
            scaling = Scaling(PerfParams(draw(st.floats(0.01, 1.0)), 0.0, draw(st.floats(0.0001, 2.0)), draw(st.floats(0.0, 0.1)),
                                         draw(st.floats(0.0001, 2.0)), draw(st.floats(0.0, 0.1)), draw(st.floats(1.0, 10.0))),
                              batch=32, explored=draw(st.integers(1, 16)))
        jobs.append(JobAsk(f"j{i}", min_np, min_np + draw(st.integers(0, 12)), submitted=float(i), scaling=scaling))
    return jobs


@settings(max_examples=150, deadline=None)
@given(_jobs_with_scaling(), st.sampled_from([1.0, 0.0, -1.0]))
def test_goodput_stays_within_bounds_and_slots(jobs, power) -> None:
    verdicts = schedule("goodput", HOSTS, jobs, now=0.0, settings=Settings(fairness_power=power))
    used = {h: 0 for h in HOSTS}
    for job in jobs:
        size = verdicts[job.id].size
        assert size == 0 or job.min_np <= size <= job.max_np
        for host, n in verdicts[job.id].placement.items():
            used[host] += n
    assert all(used[h] <= HOSTS[h] for h in HOSTS)


def test_las_serves_the_least_attained_first() -> None:
    """A job past the threshold of attained service gives its minimum up to a new one."""
    old = JobAsk("old", 8, 16, submitted=0.0, placement={"h0": 4, "h1": 4, "h2": 4, "h3": 4}, resized_at=-1000.0,
                 attained_s=20 * 3600.0 * 16)
    new = JobAsk("new", 16, 16, submitted=10.0)
    verdicts = schedule("las", HOSTS, [old, new], now=100.0)
    assert verdicts["new"].size == 16 and verdicts["old"].size == 0
    young = JobAsk("old", 8, 16, submitted=0.0, placement={"h0": 4, "h1": 4, "h2": 4, "h3": 4}, resized_at=-1000.0)
    verdicts = schedule("las", HOSTS, [young, new], now=100.0)
    assert verdicts["old"].size == 16 and verdicts["new"].size == 0


def test_a_small_gradient_noise_scale_makes_larger_batches_worth_less() -> None:
    plain = _scaling(0.001)
    noisy = Scaling(plain.params, batch=32, noise_scale=64.0, explored=16)  # the global batch soon exceeds it
    assert noisy.speedups(8, 4)[8] < 0.5 * plain.speedups(8, 4)[8]
    assert noisy.efficiency(1) == 1.0 and noisy.efficiency(3) == (64 + 32) / (64 + 96)
    jobs = [JobAsk("plain", 1, 16, submitted=0.0, scaling=plain), JobAsk("noisy", 1, 16, submitted=0.0, scaling=noisy)]
    verdicts = schedule("goodput", HOSTS, jobs, now=0.0, settings=Settings(fairness_power=1.0))
    assert verdicts["plain"].size > verdicts["noisy"].size
