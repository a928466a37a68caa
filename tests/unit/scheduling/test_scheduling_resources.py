"""Workers that ask for GPUs and CPUs besides their slot: dominant-resource fairness between
queues, placement only where every resource is free, and the rules on random pools (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ringmaster.rendezvous.scheduling.model import JobAsk, Settings
from ringmaster.rendezvous.scheduling.plan import schedule
from ringmaster.rendezvous.scheduling.resources import Left, dominant_share, room_in
from ringmaster.rendezvous.scheduling.sizing import POLICIES

NOW = 1000.0


def sizes(verdicts) -> dict[str, int]:
    return {j: v.size for j, v in verdicts.items()}


def test_fair_equalises_dominant_shares_as_in_the_drf_paper() -> None:
    # Ghodsi et al.'s example: 9 CPUs and 18 units of a second resource (here GPUs, on two hosts,
    # as two jobs that use GPUs do not share one); A's workers take <1, 4>, B's <3, 1>. DRF gives
    # A 3 workers and B 2: each holds 2/3 of its dominant resource.
    hosts, resources = {"h1": 10, "h2": 10}, {"h1": {"cpu": 3.0, "gpu": 12.0}, "h2": {"cpu": 6.0, "gpu": 6.0}}
    jobs = [JobAsk("A", 1, 100, 0.0, queue="a", demand={"cpu": 1.0, "gpu": 4.0}),
            JobAsk("B", 1, 100, 1.0, queue="b", demand={"cpu": 3.0, "gpu": 1.0})]
    verdicts = schedule("fair", hosts, jobs, NOW, resources=resources)
    assert sizes(verdicts) == {"A": 3, "B": 2}
    assert dict(verdicts["A"].placement) == {"h1": 3} and dict(verdicts["B"].placement) == {"h2": 2}
    totals = {"cpu": 9.0, "gpu": 18.0}
    assert dominant_share({"cpu": 3, "gpu": 12}, totals) == dominant_share({"cpu": 6, "gpu": 2}, totals) == 2 / 3


def test_on_slots_alone_fair_is_max_min_on_slots() -> None:
    hosts = {"a": 6, "b": 6}
    jobs = [JobAsk("x", 1, 12, 0.0, queue="x"), JobAsk("y", 1, 12, 1.0, queue="y", demand={})]
    assert sizes(schedule("fair", hosts, jobs, NOW, Settings(queue_weights={"x": 2}))) == {"x": 8, "y": 4}


def test_a_worker_goes_only_where_every_resource_it_asks_for_is_free() -> None:
    hosts, resources = {"h1": 4, "h2": 4}, {"h1": {"gpu": 2.0, "cpu": 16.0}, "h2": {"gpu": 2.0, "cpu": 16.0}}
    gpu_job = JobAsk("g", 1, 8, 0.0, demand={"gpu": 1.0, "cpu": 2.0})
    cpu_job = JobAsk("c", 1, 8, 1.0, demand={"cpu": 4.0})
    verdicts = schedule("fifo", hosts, [gpu_job, cpu_job], NOW, resources=resources)
    assert dict(verdicts["g"].placement) == {"h1": 2, "h2": 2}  # two GPUs a host, not four slots
    assert dict(verdicts["c"].placement) == {"h1": 2, "h2": 2}  # the slots left, within the CPUs left (12 each)


def test_a_job_whose_workers_do_not_fit_together_waits_and_says_why() -> None:
    hosts, resources = {"h1": 4, "h2": 4}, {"h1": {"gpu": 3.0}, "h2": {"gpu": 1.0}}
    job = JobAsk("big", 2, 2, 0.0, demand={"gpu": 2.0})  # 4 GPUs in all, but 2 on one host only once
    verdict = schedule("fifo", hosts, [job], NOW, resources=resources)["big"]
    assert verdict.size == 0 and "do not fit together" in verdict.reason and "2 gpu" in verdict.reason


def test_a_resource_no_host_declares_fits_no_worker() -> None:
    assert room_in({"slots": 8.0}, {"gpu": 1.0}) == 0
    assert room_in({"slots": 8.0}, {"gpu": 0.0}) == 8
    left = Left(4, {"cpu": 10.0})
    left.take({"cpu": 3.0}, 2)
    assert left.room({"cpu": 3.0}) == 1 and left.slots == 2


@st.composite
def resource_pools(draw):
    hosts = {f"h{i}": draw(st.integers(1, 8)) for i in range(draw(st.integers(1, 5)))}
    resources = {h: {"gpu": float(draw(st.integers(0, 8))), "cpu": float(draw(st.integers(0, 64)))} for h in hosts}
    jobs = [JobAsk(f"j{i}", (m := draw(st.integers(1, 6))), m + draw(st.integers(0, 6)), float(i),
                   queue=draw(st.sampled_from(["a", "b"])), priority=draw(st.integers(0, 2)),
                   demand={"gpu": float(draw(st.integers(0, 2))), "cpu": float(draw(st.integers(0, 8)))})
            for i in range(draw(st.integers(0, 6)))]
    return hosts, resources, jobs


@settings(max_examples=300, deadline=None)
@given(resource_pools(), st.sampled_from(POLICIES))
def test_no_host_gives_more_of_any_resource_than_it_declares(pool, policy) -> None:
    hosts, resources, jobs = pool
    verdicts = schedule(policy, hosts, jobs, NOW, Settings(queue_weights={"a": 2.0}), resources)
    used = {h: {"slots": 0.0, "gpu": 0.0, "cpu": 0.0} for h in hosts}
    for job in jobs:
        verdict = verdicts[job.id]
        assert verdict.size == 0 or job.min_np <= verdict.size <= job.max_np, (job, verdict)
        for host, n in verdict.placement.items():
            used[host]["slots"] += n
            for name, amount in job.demand.items():
                used[host][name] += amount * n
    for host in hosts:
        gpu_jobs = [j.id for j in jobs if j.demand.get("gpu", 0) > 0 and verdicts[j.id].placement.get(host)]
        assert len(gpu_jobs) <= 1, (host, gpu_jobs)
        assert used[host]["slots"] <= hosts[host]
        assert used[host]["gpu"] <= resources[host]["gpu"] + 1e-9 and used[host]["cpu"] <= resources[host]["cpu"] + 1e-9


def test_two_jobs_that_use_gpus_never_share_a_host() -> None:
    hosts, resources = {"h1": 4, "h2": 4}, {"h1": {"gpu": 4.0}, "h2": {"gpu": 4.0}}
    first = JobAsk("a", 2, 2, 0.0, demand={"gpu": 1.0})
    second = JobAsk("b", 2, 4, 1.0, demand={"gpu": 1.0})
    cpu_only = JobAsk("c", 1, 2, 2.0)
    verdicts = schedule("fifo", hosts, [first, second, cpu_only], NOW, resources=resources)
    (a_host,), (b_host,) = verdicts["a"].placement, verdicts["b"].placement
    assert a_host != b_host and verdicts["b"].size == 4  # b takes the other host whole
    assert dict(verdicts["c"].placement) == {a_host: 2}  # a job without GPUs may use a GPU job's free slots
