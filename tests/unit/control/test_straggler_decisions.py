"""Stragglers decided without I/O: the rule (a host's ranks' pace against the other hosts'), its
persistence over checks, whether replacing pays, and what the coordinator does with a find."""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from coordinator_rig import Rig
from hypothesis import given
from hypothesis import strategies as st

from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.effects import UpdateHosts
from ringmaster.rendezvous.control.stragglers import (
    Persistence,
    Straggler,
    find_stragglers,
    median_without,
    replacing_pays,
)


def events(rig: Rig, kind: Kind) -> list[Mapping[str, Any]]:
    return [e.fields for e in rig.coordinator.summary.events if e.kind is kind]


def test_a_host_whose_ranks_are_slower_than_the_others_is_found() -> None:
    paces = [("a", 0.10), ("a", 0.11), ("b", 0.10), ("b", 0.09), ("c", 0.13), ("c", 0.14)]
    (found,) = find_stragglers(paces, slowdown=1.2)
    assert found.host == "c" and 1.2 <= found.slowdown < 1.5
    assert find_stragglers(paces, slowdown=1.5) == []


def test_one_host_has_nothing_to_compare_with() -> None:
    assert find_stragglers([("a", 0.1), ("a", 0.5)]) == []
    assert find_stragglers([]) == []


def test_a_host_counts_only_when_found_in_consecutive_checks() -> None:
    watch = Persistence(checks=3)
    slow = [Straggler("b", 2.0, 0.2, 0.1)]
    assert watch.confirm(slow) == [] and watch.confirm(slow) == []
    assert watch.confirm([]) == []  # a check without it starts it over
    assert watch.confirm(slow) == [] and watch.confirm(slow) == []
    assert watch.confirm(slow) == slow


def test_replacing_pays_with_a_spare_host_or_when_the_rest_is_faster_alone() -> None:
    mild = Straggler("b", 1.3, 0.13, 0.1)
    assert replacing_pays(mild, workers=4, on_host=1, spare_slots=1)
    assert not replacing_pays(mild, workers=4, on_host=1, spare_slots=0)  # 3 workers at 1x < 4 at 1/1.3x
    severe = Straggler("b", 2.0, 0.2, 0.1)
    assert replacing_pays(severe, workers=4, on_host=2, spare_slots=0) is False  # 2 at 1x == 4 at 1/2x: no gain
    assert replacing_pays(Straggler("b", 2.5, 0.25, 0.1), workers=4, on_host=2, spare_slots=0)
    assert not replacing_pays(severe, workers=2, on_host=2, spare_slots=0)  # all of it: only with a spare


def test_replace_drains_the_straggler_once_per_generation_and_report_only_tells() -> None:
    rig = Rig(min_np=1, stragglers="replace")
    ids = rig.start_elastic({"a": 1, "b": 1, "c": 1})
    rig.stragglers_seen([Straggler("b", 1.3, 0.13, 0.1)])
    (found,) = events(rig, Kind.STRAGGLER_FOUND)
    assert found["host"] == "b" and found["replaced"] is False, "no spare, and 3 workers at 1/1.3x beat 2 at 1x"
    rig.stragglers_seen([Straggler("c", 3.0, 0.3, 0.1)])
    found = events(rig, Kind.STRAGGLER_FOUND)[-1]
    assert found["replaced"] is True and "faster on the rest" in found["action"], "2 workers at 1x beat 3 at 1/3x"
    rig = Rig(min_np=1, max_np=2, stragglers="replace")
    ids = rig.start_elastic({"a": 1, "b": 1, "c": 1})
    gen = rig.gen()
    assert gen is not None
    on = {a.host for a in gen.members}
    straggler = sorted(on)[1]
    rig.stragglers_seen([Straggler(straggler, 3.0, 0.3, 0.1)])
    rig.stragglers_seen([Straggler(straggler, 3.0, 0.3, 0.1)])  # (told once per generation)
    (found,) = events(rig, Kind.STRAGGLER_FOUND)
    assert found["replaced"] is True and "another host" in found["action"]
    (draining,) = events(rig, Kind.HOST_DRAINING)
    assert draining["host"] == straggler and draining["source"] == "straggler"
    assert rig.last(ids[0], UpdateHosts).reason == f"host(s) leaving: {straggler}"
    reporting = Rig(min_np=1, max_np=2)
    reporting.start_elastic({"a": 1, "b": 1, "c": 1})
    reporting.stragglers_seen([Straggler("b", 3.0, 0.3, 0.1)])
    assert events(reporting, Kind.STRAGGLER_FOUND)[0]["replaced"] is False
    assert not events(reporting, Kind.HOST_DRAINING)


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from([0.1, 0.2, 0.25, 0.3, 1.0, 2.5])), max_size=40))
def test_the_others_median_is_the_median_of_every_other_rank(paces) -> None:
    """The fast median (one sorted list less a host's own) equals the plain one, duplicates and all."""
    everyone = sorted(p for _, p in paces)
    for host in {h for h, _ in paces}:
        mine = sorted(p for h, p in paces if h == host)
        others = [p for h, p in paces if h != host]
        assert median_without(everyone, mine) == (statistics.median(others) if others else None)
