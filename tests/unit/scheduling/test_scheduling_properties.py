"""The rules every policy keeps, checked on random pools and queues (hypothesis): sizes within
each job's min and max or zero, in whole replica groups, never more slots than exist on any host, whole minimums only,
no waiting job that would fit, work conserved (under `goodput`: where a job gains from it), workers never moved without
cause (a growing job's workers move only to span fewer hosts or to make its replica groups whole on their hosts), held
jobs left alone unless a job starts."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ringmaster.rendezvous.scheduling.adaptive import trusted_size, value_curve
from ringmaster.rendezvous.scheduling.model import JobAsk, Settings
from ringmaster.rendezvous.scheduling.plan import schedule
from ringmaster.rendezvous.scheduling.sizing import POLICIES

NOW = 1000.0
RULES = Settings(min_resize_interval_s=60.0, queue_weights={"a": 2.0, "b": 1.0})


@st.composite
def pools(draw):
    """Hosts with slots, and jobs of which some already run on them (within each host's slots)."""
    hosts = {f"h{i}": draw(st.integers(1, 8)) for i in range(draw(st.integers(1, 6)))}
    free = dict(hosts)
    jobs = []
    for i in range(draw(st.integers(0, 7))):
        group = draw(st.sampled_from([1, 1, 2, 3]))  # workers per replica group (--group-size)
        min_np = group * draw(st.integers(1, max(12 // group, 1)))
        max_np = min_np + group * draw(st.integers(0, 10 // group))
        placement: dict[str, int] = {}
        if draw(st.booleans()):  # a running job, at a size it was given within its bounds
            want = group * draw(st.integers(min_np // group, max_np // group))
            for host in draw(st.permutations(sorted(free))):
                take = min(free[host], want - sum(placement.values()))
                if take > 0:
                    placement[host] = take
                    free[host] -= take
            if sum(placement.values()) != want:  # (placed whole, as the pool places)
                for host, n in placement.items():
                    free[host] += n
                placement = {}
        resized = draw(st.sampled_from([None, NOW - 5.0, NOW - 500.0])) if placement else None
        jobs.append(JobAsk(f"j{i}", min_np, max_np, submitted=float(draw(st.integers(0, 50))),
                           queue=draw(st.sampled_from(["a", "b", "c"])), priority=draw(st.integers(-2, 2)),
                           placement=placement, resized_at=resized, group_size=group))
    gone = draw(st.sets(st.sampled_from(sorted(hosts)), max_size=2))  # hosts that failed since
    usable = {h: n for h, n in hosts.items() if h not in gone or len(gone) == len(hosts)}
    return usable, jobs


@settings(max_examples=400, deadline=None)
@given(pools(), st.sampled_from(POLICIES))
def test_every_policy_keeps_the_pools_rules(pool, policy) -> None:
    hosts, jobs = pool
    verdicts = schedule(policy, hosts, jobs, NOW, RULES)
    assert set(verdicts) == {j.id for j in jobs}
    used = {h: 0 for h in hosts}
    for job in jobs:
        verdict = verdicts[job.id]
        assert verdict.size == 0 or job.min_np <= verdict.size <= job.max_np, (job, verdict)
        assert verdict.size % job.group_size == 0, (job, verdict)  # whole replica groups
        assert all(h in hosts and n > 0 for h, n in verdict.placement.items()), verdict
        for h, n in verdict.placement.items():
            used[h] += n
        usable_before = {h: n for h, n in job.placement.items() if h in hosts}
        if verdict.size == sum(usable_before.values()):  # kept: nothing it had is taken away
            assert all(verdict.placement.get(h, 0) >= n for h, n in usable_before.items()), (job, verdict)
        elif verdict.size > sum(usable_before.values()):  # growing: what it had is kept, or it is packed on fewer hosts
            kept = all(verdict.placement.get(h, 0) >= n for h, n in usable_before.items())
            # (or its groups made whole: a group split over two hosts sends its all-gathers between them)
            regrouped = any(n % job.group_size for n in usable_before.values()) and all(
                n % job.group_size == 0 for n in verdict.placement.values())
            assert kept or regrouped or len(verdict.placement) < len(usable_before) + len(
                set(verdict.placement) - set(usable_before)
            ), (job, verdict)
        elif verdict.size > 0:  # shrinking: only gives back, or it is packed on fewer hosts (it pauses anyway)
            gives_back = all(n <= usable_before.get(h, 0) for h, n in verdict.placement.items())
            assert gives_back or len(verdict.placement) < len(usable_before), (job, verdict)
        assert verdict.reason
    assert all(used[h] <= hosts[h] for h in hosts), used
    free = sum(hosts.values()) - sum(used.values())
    held = [j for j in jobs if verdicts[j.id].reason.startswith("held")]
    starts = any(verdicts[j.id].size > 0 and not j.running for j in jobs)
    for job in held:  # the interval holds a job's size unless a job starts
        assert verdicts[job.id].size == job.size or (starts and verdicts[job.id].size < job.size)
    growable = [j for j in jobs if 0 < verdicts[j.id].size < j.max_np and j not in held and free >= j.group_size]
    if policy == "goodput":  # conserving where growing gains: a slot stays free only if no job gains from it
        growable = [j for j in growable if _gains_from(j, verdicts[j.id].size, free, hosts)]
    assert free == 0 or not growable, (free, growable)  # work conserving
    minimums = sum(verdicts[j.id].size if j in held else j.min_np for j in jobs if verdicts[j.id].size > 0)
    for job in jobs:  # gang admission that leaves nobody out who would fit
        if verdicts[job.id].size == 0:
            assert job.min_np > sum(hosts.values()) - minimums, (job, verdicts)


def _gains_from(job: JobAsk, size: int, free: int, hosts: dict[str, int]) -> bool:
    """Whether `goodput` sees a gain in growing `job` from `size` into up to `free` more slots."""
    usable = {h: n for h, n in job.placement.items() if h in hosts}  # as the round sees it
    job = replace(job, placement=usable if sum(usable.values()) >= job.min_np else {})
    rules = replace(RULES, host_slots=max(hosts.values()))
    curve = value_curve(job, trusted_size(job, rules), rules)
    return any(curve[n] > curve[size] for n in range(size + job.group_size, min(len(curve), size + free + 1),
                                                     job.group_size))


@settings(max_examples=200, deadline=None)
@given(pools(), st.sampled_from(POLICIES))
def test_a_plan_is_stable_when_nothing_changes(pool, policy) -> None:
    """Apply a plan, schedule again at once: nobody is resized a second time."""
    hosts, jobs = pool
    first = schedule(policy, hosts, jobs, NOW, RULES)
    applied = [JobAsk(j.id, j.min_np, j.max_np, j.submitted, j.queue, j.priority, dict(first[j.id].placement),
                      resized_at=(NOW if first[j.id].size != j.size else j.resized_at) if first[j.id].size else None,
                      group_size=j.group_size)
               for j in jobs]
    second = schedule(policy, hosts, applied, NOW + 1, RULES)
    for job in applied:
        if job.running:
            assert dict(second[job.id].placement) == dict(job.placement), (job, second[job.id], first)
