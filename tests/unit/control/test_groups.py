"""Generations of whole replica groups (`groups.arrange`): a member lost takes its group out,
groups that stay keep their order, new groups are packed onto as few hosts as they can be."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringmaster.rendezvous.control.assignment import WorkerSlot
from ringmaster.rendezvous.control.groups import arrange, kept_groups, pack

HOSTS = ["a", "b", "c", "d"]


def _slots(prefix: str, hosts: list[str]) -> list[WorkerSlot]:
    return [WorkerSlot(f"{prefix}{i}", host) for i, host in enumerate(hosts)]


@given(st.integers(1, 4), st.lists(st.sampled_from(HOSTS), max_size=16), st.data(),
       st.lists(st.sampled_from(HOSTS), max_size=12), st.one_of(st.none(), st.integers(1, 8)))
def test_a_generation_is_whole_groups_with_every_surviving_group_kept_in_order(
        k: int, previous_hosts: list[str], data: st.DataObject, newcomer_hosts: list[str],
        groups_cap: int | None) -> None:
    previous = _slots("p", previous_hosts[: len(previous_hosts) - len(previous_hosts) % k])
    alive = data.draw(st.lists(st.booleans(), min_size=len(previous), max_size=len(previous)))
    survivors = [slot for slot, up in zip(previous, alive) if up]
    newcomers = _slots("n", newcomer_hosts)
    limit = None if groups_cap is None else groups_cap * k
    placed, waiting = arrange(survivors, [s.worker_id for s in previous], newcomers, k, limit)

    assert len(placed) % k == 0 and (limit is None or len(placed) <= limit)
    ids = [s.worker_id for s in placed]
    assert len(set(ids)) == len(ids)
    assert sorted(ids + [s.worker_id for s in waiting]) == sorted(s.worker_id for s in (*survivors, *newcomers))
    whole = [[s.worker_id for s in previous[i: i + k]] for i in range(0, len(previous), k)
             if all(alive[i: i + k])]
    groups = [ids[i: i + k] for i in range(0, len(ids), k)]
    # every whole group of the last generation comes first, in its order, as far as the limit goes
    kept_here = whole[: len(groups)]
    assert groups[: len(kept_here)] == kept_here
    # no worker of a broken group is placed in a group with a member of a kept group
    for group in groups[len(kept_here):]:
        assert not any(w in {x for g in whole for x in g} for w in group)
    # with no limit, nobody waits who could make a group with the others waiting
    if limit is None:
        assert len(waiting) < k


def test_a_member_lost_takes_its_group_out_and_its_partner_waits_for_a_new_one() -> None:
    previous = _slots("w", ["a", "a", "b", "b"])  # groups (w0, w1) on a, (w2, w3) on b
    survivors = [previous[0], previous[1], previous[2]]  # w3 lost
    placed, waiting = arrange(survivors, [s.worker_id for s in previous], [], 2, 4)
    assert [s.worker_id for s in placed] == ["w0", "w1"] and [s.worker_id for s in waiting] == ["w2"]
    newcomer = WorkerSlot("n0", "b")  # its slot refilled
    placed, waiting = arrange(placed + [previous[2]], ["w0", "w1"], [newcomer], 2, 4)
    assert [s.worker_id for s in placed] == ["w0", "w1", "w2", "n0"] and not waiting


def test_the_group_holding_rank_0_lost_leaves_rank_0_to_the_next_whole_group() -> None:
    previous = _slots("w", ["a", "a", "b", "b", "c", "c"])
    survivors = previous[1:]
    placed, waiting = arrange(survivors, [s.worker_id for s in previous], [], 2, None)
    assert [s.worker_id for s in placed] == ["w2", "w3", "w4", "w5"] and [s.worker_id for s in waiting] == ["w1"]


@pytest.mark.parametrize("hosts, k, spans", [
    (["a"] * 4 + ["b"] * 4, 4, [1, 1]),            # a host of 4 slots holds a whole group
    (["a"] * 3 + ["b"] * 3, 2, [1, 1, 2]),          # 3 and 3 in pairs: one pair must span two hosts
    (["a", "b", "a", "b", "a", "b", "a", "b"], 4, [1, 1]),  # interleaved in the order given, still one host each
    (["a"] * 6 + ["b"] * 2 + ["c"] * 2, 4, [1, 2]),  # 6 on a: one group there, the rest on a and b (largest left first)
])
def test_new_groups_span_no_more_hosts_than_they_must(hosts: list[str], k: int, spans: list[int]) -> None:
    groups = pack(_slots("n", hosts), k)
    assert [len({s.host for s in g}) for g in groups] == spans
    assert all(len(g) == k for g in groups)


def test_kept_groups_need_every_member() -> None:
    previous = ["a", "b", "c", "d", "e", "f"]
    assert kept_groups(previous, {"a", "b", "d", "e", "f"}, 2) == [["a", "b"], ["e", "f"]]
    assert kept_groups(previous, {"a", "b", "d", "e", "f"}, 3) == [["d", "e", "f"]]
    with pytest.raises(ValueError, match="twice"):
        arrange([WorkerSlot("a", "h")], ["a"], [WorkerSlot("a", "h")], 2, None)
