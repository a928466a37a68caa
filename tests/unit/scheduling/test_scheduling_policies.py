"""Each policy on the situations it exists for, with the exact sizes and hosts it must give."""

from __future__ import annotations

import pytest

from ringmaster.rendezvous.scheduling.model import JobAsk, Settings
from ringmaster.rendezvous.scheduling.plan import schedule

NOW = 10_000.0
LONG_AGO = 0.0


def job(id: str, min_np: int, max_np: int, submitted: float, placement: dict[str, int] | None = None,
        resized_at: float | None = LONG_AGO, **kw) -> JobAsk:
    return JobAsk(id, min_np, max_np, submitted, placement=placement or {},
                  resized_at=resized_at if placement else None, **kw)


def sizes(verdicts) -> dict[str, int]:
    return {j: v.size for j, v in verdicts.items()}


def test_fifo_backfills_a_later_job_into_slots_the_head_cannot_use_yet() -> None:
    hosts = {"a": 4, "b": 4}
    jobs = [job("run", 6, 6, 0, {"a": 4, "b": 2}), job("head", 4, 8, 1), job("small", 2, 2, 2)]
    v = schedule("fifo", hosts, jobs, NOW)
    assert sizes(v) == {"run": 6, "head": 0, "small": 2}
    assert dict(v["small"].placement) == {"b": 2}
    assert v["head"].reason.startswith("waiting: needs 4 slots together")


def test_fifo_admits_before_it_grows_and_grows_in_order_of_arrival() -> None:
    hosts = {"a": 4, "b": 4, "c": 4}
    jobs = [job("first", 2, 12, 0), job("second", 2, 12, 1), job("third", 12, 12, 2)]
    assert sizes(schedule("fifo", hosts, jobs, NOW)) == {"first": 10, "second": 2, "third": 0}


def test_fifo_takes_the_leftover_of_a_grown_job_back_to_admit_the_next_one() -> None:
    hosts = {"a": 4, "b": 4}
    jobs = [job("grown", 2, 8, 0, {"a": 4, "b": 4}), job("next", 3, 3, 1)]
    v = schedule("fifo", hosts, jobs, NOW)
    assert sizes(v) == {"grown": 5, "next": 3}
    kept = dict(v["grown"].placement)
    assert sorted(kept.values()) == [1, 4]  # it keeps one host whole, gives back on the other
    assert dict(v["next"].placement) == {min(kept, key=kept.__getitem__): 3}


def test_priority_shrinks_lower_jobs_toward_their_minimum_before_suspending_any() -> None:
    hosts = {"a": 8}
    jobs = [job("low", 2, 8, 0, {"a": 8}, priority=0), job("high", 5, 5, 1, priority=5)]
    v = schedule("priority", hosts, jobs, NOW)
    assert sizes(v) == {"low": 3, "high": 5}
    assert v["low"].reason.startswith("shrinks to 3")


def test_priority_suspends_the_lowest_when_shrinking_is_not_enough_and_it_resumes_later() -> None:
    hosts = {"a": 4, "b": 4}
    jobs = [job("low", 4, 8, 0, {"a": 4, "b": 4}, priority=0), job("mid", 2, 2, 1, priority=1),
            job("high", 4, 4, 2, priority=9)]
    v = schedule("priority", hosts, jobs, NOW)
    assert sizes(v) == {"low": 0, "mid": 2, "high": 4}
    assert v["low"].reason.startswith("suspended")
    after = [job("low", 4, 8, 0, priority=0), job("mid", 2, 2, 1, dict(v["mid"].placement), priority=1)]
    assert sizes(schedule("priority", hosts, after, NOW + 1)) == {"low": 6, "mid": 2}  # high finished


def test_priority_does_not_suspend_for_a_job_that_could_not_start_anyway() -> None:
    hosts = {"a": 4}
    jobs = [job("low", 2, 4, 0, {"a": 4}), job("huge", 8, 8, 1, priority=9)]
    assert sizes(schedule("priority", hosts, jobs, NOW)) == {"low": 4, "huge": 0}


def test_priority_among_equals_does_not_preempt_a_running_job() -> None:
    hosts = {"a": 4}
    jobs = [job("running", 4, 4, 5, {"a": 4}), job("earlier", 2, 2, 1)]
    assert sizes(schedule("priority", hosts, jobs, NOW)) == {"running": 4, "earlier": 0}


def test_fair_divides_by_queue_weight_and_equally_inside_a_queue() -> None:
    hosts = {"a": 6, "b": 6}
    rules = Settings(queue_weights={"team-a": 2, "team-b": 1})
    jobs = [job("a1", 1, 12, 0, queue="team-a"), job("a2", 1, 12, 1,
                                                     queue="team-a"), job("b1", 1, 12, 2, queue="team-b")]
    assert sizes(schedule("fair", hosts, jobs, NOW, rules)) == {"a1": 4, "a2": 4, "b1": 4}


def test_fair_lends_an_idle_queues_share_and_takes_it_back_by_shrinking() -> None:
    hosts = {"a": 4, "b": 4}
    rules = Settings(queue_weights={"x": 1, "y": 1})
    alone = schedule("fair", hosts, [job("x1", 2, 8, 0, queue="x")], NOW, rules)
    assert sizes(alone) == {"x1": 8}
    back = schedule("fair", hosts, [job("x1", 2, 8, 0, dict(alone["x1"].placement), queue="x"),
                                    job("y1", 2, 8, 1, queue="y")], NOW, rules)
    assert sizes(back) == {"x1": 4, "y1": 4}
    assert sorted(dict(back["x1"].placement).values()) == [4] and sorted(dict(back["y1"].placement).values()) == [4]


def test_fair_admits_from_the_queue_that_holds_least() -> None:
    hosts = {"a": 4}
    jobs = [job("x1", 2, 2, 0, {"a": 2}, queue="x"), job("x2", 2, 2, 1, queue="x"), job("y1", 2, 2, 2, queue="y")]
    assert sizes(schedule("fair", hosts, jobs, NOW)) == {"x1": 2, "x2": 0, "y1": 2}


@pytest.mark.parametrize("policy", ["fifo", "priority", "fair"])
def test_a_job_resized_recently_is_held_unless_a_job_starts(policy) -> None:
    hosts = {"a": 8}
    rules = Settings(min_resize_interval_s=60, queue_weights={})
    grown = [job("old", 2, 8, 0, {"a": 4}, resized_at=NOW - 10), job("new", 2, 8, 1, {"a": 4}, resized_at=NOW - 10)]
    # fifo and priority would give `old` the spare slots, fair would even them out: nothing free here,
    # and both were resized 10 s ago, so both are held.
    v = schedule(policy, hosts, grown, NOW, rules)
    assert sizes(v) == {"old": 4, "new": 4}
    if policy != "fair":
        assert v["new"].reason.startswith("held at 4")
    starting = [*grown, job("third", 2, 2, 2, priority=1)]
    assert sizes(schedule(policy, hosts, starting, NOW, rules))["third"] == 2  # a start may shrink a held job
    later = schedule(policy, hosts, grown, NOW + 61, rules)
    assert sum(sizes(later).values()) == 8


def test_a_held_job_does_not_grow_into_slots_left_free() -> None:
    hosts = {"a": 8}
    rules = Settings(min_resize_interval_s=60)
    v = schedule("fifo", hosts, [job("j", 2, 8, 0, {"a": 4}, resized_at=NOW - 1)], NOW, rules)
    assert v["j"].size == 4 and v["j"].reason.startswith("held")
    assert schedule("fifo", hosts, [job("j", 2, 8, 0, {"a": 4}, resized_at=NOW - 1, urgent=True)], NOW,
                    rules)["j"].size == 8


@pytest.mark.parametrize("policy", ["fair", "priority"])
def test_a_resize_not_yet_taken_holds_the_job_however_long_ago_it_was_decided(policy) -> None:
    """A job grown (or shrunk) has not trained at its new size until its next commit; judged then,
    a policy would undo a growth on a size it never measured (a newcomer slow to warm up)."""
    hosts = {"a": 4, "b": 4}
    rules = Settings(min_resize_interval_s=10)
    other = job("other", 2, 8, 1, {"b": 2}, resized_at=NOW - 1000, priority=1)
    taken = job("grown", 2, 8, 0, {"a": 4, "b": 2}, resized_at=NOW - 1000)  # trained at 6 long ago
    assert schedule(policy, hosts, [taken, other], NOW, rules)["grown"].size < 6  # evened out, or to `other` first
    grown = job("grown", 2, 8, 0, {"a": 4, "b": 2}, resized_at=NOW - 1000, settling=True)
    v = schedule(policy, hosts, [grown, other], NOW, rules)
    assert v["grown"].size == 6 and v["grown"].reason.startswith("held at 6: resized, and not yet trained"), v
    starting = [grown, other, job("third", 2, 2, 2, priority=2)]  # a start may still shrink it
    assert sizes(schedule(policy, hosts, starting, NOW, rules))["third"] == 2


def test_a_job_that_lost_a_host_below_its_minimum_waits_and_keeps_its_survivors_when_let_in() -> None:
    hosts = {"b": 2, "c": 2}  # host a failed
    jobs = [job("j", 3, 3, 0, {"a": 2, "b": 1}, resized_at=NOW - 1), job("other", 1, 1, 1, {"c": 1})]
    v = schedule("fifo", hosts, jobs, NOW)
    assert v["j"].size == 3 and dict(v["j"].placement)["b"] >= 1
    crowded = [job("j", 3, 3, 0, {"a": 2, "b": 1}), job("other", 3, 3, 1, {"c": 2, "b": 1})]
    v = schedule("fifo", hosts, crowded, NOW)
    assert v["j"].size == 0 and v["j"].reason.startswith("waiting")


def test_placement_uses_as_few_hosts_as_possible_then_the_host_it_fills_best() -> None:
    hosts = {"a": 4, "b": 8, "c": 8}
    v = schedule("fifo", hosts, [job("x", 8, 8, 0), job("y", 4, 4, 1)], NOW)
    assert len(v["x"].placement) == 1 and "a" not in v["x"].placement
    assert dict(v["y"].placement) == {"a": 4}  # fills the 4-slot host: an 8-slot one stays whole


def test_growth_first_fills_the_hosts_a_job_is_on() -> None:
    hosts = {"a": 4, "b": 4, "c": 4}
    v = schedule("fifo", hosts, [job("x", 2, 6, 0, {"b": 2}), job("y", 2, 2, 1, {"c": 2})], NOW)
    assert dict(v["x"].placement) == {"b": 4, "c": 2}  # then the busy host it fills: "a" stays whole


def test_a_resized_job_spread_over_more_hosts_than_it_needs_is_packed_again() -> None:
    hosts = {"a": 4, "b": 4, "c": 4}
    x = job("x", 2, 4, 0, {"a": 1, "b": 1, "c": 1})
    assert dict(schedule("fifo", hosts, [x], NOW)["x"].placement) in ({"a": 4}, {"b": 4}, {"c": 4})
    kept = job("x", 3, 3, 0, {"a": 1, "b": 1, "c": 1})  # not resized: not moved
    assert dict(schedule("fifo", hosts, [kept], NOW)["x"].placement) == {"a": 1, "b": 1, "c": 1}


def test_a_job_of_replica_groups_gets_whole_groups_and_each_host_holds_whole_groups_where_it_can() -> None:
    three = {"a": 3, "b": 3, "c": 3}
    v = schedule("fifo", three, [job("x", 2, 6, 0, group_size=2), job("y", 1, 1, 1)], NOW)
    assert sizes(v) == {"x": 6, "y": 1}
    assert sorted(v["x"].placement.values()) == [2, 2, 2]  # not 3 + 3: no group split over two hosts
    one = schedule("fifo", three, [job("x", 2, 6, 0)], NOW)["x"]  # without groups: the fewest hosts
    assert sorted(one.placement.values()) == [3, 3]
    v = schedule("fifo", {"a": 3, "b": 2}, [job("x", 2, 4, 0, group_size=2)], NOW)
    assert dict(v["x"].placement) == {"a": 2, "b": 2}  # a's third slot would split a group
    v = schedule("fifo", {"a": 1, "b": 1, "c": 1}, [job("x", 2, 4, 0, group_size=2)], NOW)
    assert v["x"].size == 2 and len(v["x"].placement) == 2  # no host holds a group: split, and the odd slot left
    grown = schedule("fifo", {"a": 4, "b": 4}, [job("x", 2, 8, 0, {"a": 1, "b": 1}, group_size=2)], NOW)["x"]
    assert dict(grown.placement) in ({"a": 4, "b": 4},)
    v = schedule("fifo", {"a": 4}, [job("x", 2, 4, 0, {"a": 2}, group_size=2), job("y", 1, 1, 1)], NOW)
    assert sizes(v) == {"x": 2, "y": 1}  # one slot left: not half a group


def test_bad_input_is_refused_with_what_was_wrong() -> None:
    with pytest.raises(ValueError, match="min_np 3 and max_np 2"):
        JobAsk("j", 3, 2, 0)
    with pytest.raises(ValueError, match="min_np 3 and max_np 4 must be whole numbers of groups of 2"):
        JobAsk("j", 3, 4, 0, group_size=2)
    with pytest.raises(ValueError, match="unknown policy 'lottery'"):
        schedule("lottery", {"a": 1}, [], NOW)
    with pytest.raises(ValueError, match="unique"):
        schedule("fifo", {"a": 1}, [job("j", 1, 1, 0), job("j", 1, 1, 1)], NOW)
