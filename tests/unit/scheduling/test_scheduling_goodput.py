"""The `goodput` policy's parts: the step-time model's fit (recovers known parameters from noisy
samples and predicts sizes it never saw), the allocator (within min and max, never more slots
than exist, slots to the job that gains most, no resize without gain) and `las`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringmaster.rendezvous.scheduling.model import JobAsk, Settings
from ringmaster.rendezvous.scheduling.placement import place
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
    assert fitted.compute_s + 64 * fitted.compute_per_sample_s == pytest.approx(
        TRUE.compute_s + 64 * TRUE.compute_per_sample_s, rel=0.02
    )


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
            scaling = Scaling(PerfParams(draw(st.floats(0.01, 1.0)), 0.0, draw(st.floats(0.0001, 2.0)),
                                         draw(st.floats(0.0, 0.1)),
                                         draw(st.floats(0.0001, 2.0)), draw(st.floats(0.0, 0.1)),
                                         draw(st.floats(1.0, 10.0))),
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


def test_a_job_measured_only_across_hosts_is_not_predicted_slow_on_one() -> None:
    """Run at one worker and only across hosts otherwise, the fit cannot tell what a ring inside
    one host costs; it must not guess it dearer than across hosts (the job would never be placed
    on one host and never learn better)."""
    ring_bound = PerfParams(compute_s=0.33, compute_per_sample_s=1e-6, host_sync_s=0.05, host_sync_per_worker_s=0.01,
                            net_sync_s=1.1, net_sync_per_worker_s=0.001, overlap=1.5)
    samples = _samples(ring_bound, [(4, 15), (3, 9), (2, 5), (1, 1)], (8,), noise=0.0)
    fitted = fit(samples)
    for workers in (2, 3, 4):
        assert float(step_time(fitted, 1, workers, 8)) <= float(step_time(fitted, 2, workers, 8)) * 1.001


def _ring_bound(explored: int = 8) -> Scaling:
    """A job whose ring across hosts costs ten times its ring inside one (per-worker batch kept)."""
    return Scaling(PerfParams(0.1, 0.0, 0.01, 0.0, 0.5, 0.0, 1.0), batch=32, explored=explored)


def test_a_ring_bound_job_spread_over_hosts_is_moved_onto_one() -> None:
    spread = {"h0": 2, "h1": 2}
    others = [JobAsk("a", 2, 2, submitted=0.0, placement={"h0": 2}, resized_at=-1000.0),
              JobAsk("b", 2, 2, submitted=0.0, placement={"h1": 2}, resized_at=-1000.0)]
    hosts = {"h0": 4, "h1": 4, "h2": 4}
    job = JobAsk("j", 4, 4, submitted=0.0, placement=spread, resized_at=-1000.0, scaling=_ring_bound())
    verdict = schedule("goodput", hosts, [job, *others], now=0.0)["j"]
    assert dict(verdict.placement) == {"h2": 4} and verdict.reason.startswith("moves onto 1 host(s) from 2")
    flat = Scaling(PerfParams(0.1, 0.0, 0.001, 0.0, 0.001, 0.0, 1.0), batch=32, explored=8)  # no gain on one host
    verdict = schedule("goodput", hosts, [replace(job, scaling=flat), *others], now=0.0)["j"]
    assert dict(verdict.placement) == spread
    recent = replace(job, resized_at=-10.0)  # resized within the interval: it stays
    assert dict(schedule("goodput", hosts, [recent, *others], now=0.0)["j"].placement) == spread


def test_a_job_that_shrinks_is_packed_on_fewer_hosts_when_it_can_be() -> None:
    spread = {"h0": 2, "h1": 2, "h2": 2, "h3": 2}
    hosts = {f"h{i}": 4 for i in range(4)}
    assert place(hosts, {"j": spread}, {"j": 4}, ["j"])["j"] == {"h0": 4}
    others = {"a": {"h0": 2}, "b": {"h1": 2}, "c": {"h2": 2}, "d": {"h3": 2}}  # no host has room for 4
    placements = place(hosts, {"j": spread, **others}, {"j": 4, "a": 2, "b": 2, "c": 2, "d": 2}, ["j", *others])
    assert sum(placements["j"].values()) == 4 and len(placements["j"]) == 2


def test_goodput_starts_a_new_job_in_place_of_one_past_the_preemption_threshold() -> None:
    rules = Settings(preempt_after_slot_s=3600.0)
    one_host = {"h0": 4}
    new = JobAsk("new", 3, 4, submitted=10.0)
    long = JobAsk("long", 2, 4, submitted=0.0, placement={"h0": 4}, resized_at=-1000.0, attained_s=2 * 3600.0)
    verdicts = schedule("goodput", one_host, [long, new], now=100.0, settings=rules)
    assert verdicts["new"].size >= 3 and verdicts["long"].size == 0
    assert verdicts["long"].reason.startswith("suspended")
    short = replace(long, attained_s=600.0)  # below the threshold: it keeps its minimum, the new job waits
    verdicts = schedule("goodput", one_host, [short, new], now=100.0, settings=rules)
    assert verdicts["long"].size >= 2 and verdicts["new"].size == 0
    never = Settings(preempt_after_slot_s=0.0)
    assert schedule("goodput", one_host, [long, new], now=100.0, settings=never)["new"].size == 0


def test_long_jobs_grow_one_after_another_not_evenly() -> None:
    """Two long jobs that scale alike: the older takes most of the pool (it finishes sooner, the
    other no later than if they had shared); two short ones share it."""
    linear = Scaling(PerfParams(0.1, 0.0, 1e-4, 0.0, 1e-4, 0.0, 1.0), batch=32, explored=16)
    done = 20 * 3600.0
    jobs = [JobAsk(name, 1, 16, submitted=float(i), placement={f"h{2 * i}": 4, f"h{2 * i + 1}": 4},
                   resized_at=-1000.0, attained_s=done, scaling=linear) for i, name in enumerate(["older", "newer"])]
    verdicts = schedule("goodput", HOSTS, jobs, now=0.0)
    assert verdicts["older"].size >= verdicts["newer"].size + 4
    young = [replace(j, attained_s=0.0) for j in jobs]
    verdicts = schedule("goodput", HOSTS, young, now=0.0)
    assert abs(verdicts["older"].size - verdicts["newer"].size) <= 2


def test_a_declared_global_batch_speeds_up_only_until_each_worker_has_one_micro_batch() -> None:
    """A global batch of 256 in micro-batches of 32 (K = 8): more workers shorten a step of the
    same samples (fewer micro-batches each), uneven shares costing the busiest worker's time (3
    workers: 3, 3, 2); past 8 workers none has anything to compute, and the policy gives none."""
    from ringmaster.rendezvous.scheduling.throughput import compute_time

    params = PerfParams(compute_s=0.005, compute_per_sample_s=0.002, host_sync_s=0.002, host_sync_per_worker_s=0.001,
                        net_sync_s=0.01, net_sync_per_worker_s=0.002, overlap=1.0)
    declared = Scaling(params, batch=256, per_worker_batch=False, micro_batch=32, explored=16)
    three = step_time(params, 1, 3, 32) + 2 * compute_time(params, 32)
    assert float(declared.throughput(3, 1)) == pytest.approx(256 / float(three))
    speedups = declared.speedups(16, 16)
    assert all(speedups[n + 1] > speedups[n] for n in range(1, 8) if -(-8 // (n + 1)) < -(-8 // n))
    assert max(speedups[9:]) < speedups[8]
    jobs = [JobAsk("declared", 1, 16, submitted=0.0, scaling=declared),
            JobAsk("plain", 1, 16, submitted=0.0, scaling=_scaling(0.001))]
    verdicts = schedule("goodput", HOSTS, jobs, now=0.0, settings=Settings(fairness_power=1.0))
    assert 1 <= verdicts["declared"].size <= 8 and verdicts["plain"].size > 8
