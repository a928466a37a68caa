"""Rank assignment: survivors keep their order, newcomers go last, topology is consistent."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ringmaster.rendezvous.control.assignment import WorkerSlot, appended_ranks, assign_ranks, host_counts, order_keys

slots = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", "c", "d"])), max_size=20, unique_by=lambda t: t[0]
)


def _workers(pairs, prefix):
    return [WorkerSlot(f"{prefix}{i}", host) for i, host in pairs]


@given(slots, slots, st.one_of(st.none(), st.integers(1, 30)))
def test_rank_rules(survivor_pairs, newcomer_pairs, max_np) -> None:
    survivors = _workers(survivor_pairs, "s")
    newcomers = _workers(newcomer_pairs, "n")
    result = assign_ranks(survivors, newcomers, max_np)
    expected = (survivors + newcomers)[: max_np if max_np is not None else None]
    assert [a.worker_id for a in result] == [w.worker_id for w in expected]
    assert [a.rank for a in result] == list(range(len(result)))
    assert all(a.size == len(result) for a in result)
    if survivors and (max_np is None or max_np >= 1):
        assert result[0].worker_id == survivors[0].worker_id  # rank 0 stays rank 0
    hosts = {a.host for a in result}
    for host in hosts:
        on_host = [a for a in result if a.host == host]
        assert [a.local_rank for a in on_host] == list(range(len(on_host)))
        assert all(a.local_size == len(on_host) for a in on_host)
    for local in {a.local_rank for a in result}:
        crossing = [a for a in result if a.local_rank == local]
        assert sorted(a.cross_rank for a in crossing) == list(range(len(crossing)))
        assert all(a.cross_size == len(crossing) for a in crossing)


def test_survivor_order_after_a_failure() -> None:
    before = assign_ranks([], [WorkerSlot(f"w{i}", "ab"[i // 2]) for i in range(4)])
    alive = [WorkerSlot(a.worker_id, a.host) for a in before if a.worker_id != "w1"]
    after = assign_ranks(alive, [WorkerSlot("w9", "c")])
    assert [(a.worker_id, a.rank) for a in after] == [("w0", 0), ("w2", 1), ("w3", 2), ("w9", 3)]
    assert [(a.local_rank, a.cross_rank, a.cross_size) for a in after] == [(0, 0, 3), (0, 1, 3), (1, 0, 1), (0, 2, 3)]


def test_duplicate_worker_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="appears twice"):
        assign_ranks([WorkerSlot("x", "a")], [WorkerSlot("x", "a")])


@given(st.lists(st.integers(0, 40), unique=True, max_size=30), st.data())
def test_order_keys_rise_in_rank_order_and_survivors_keep_theirs(previous_ids, data) -> None:
    """Generation after generation: some members leave, newcomers join last; a survivor keeps
    its key (the store rewrites only runs that changed), and keys always rise in rank order."""
    previous_members = assign_ranks(_workers([(i, "a") for i in previous_ids], "w"), [])
    previous = dict(zip((a.worker_id for a in previous_members), order_keys(previous_members, {})))
    survivors = [WorkerSlot(a.worker_id, a.host) for a in previous_members if data.draw(st.booleans())]
    newcomers = _workers([(i, "b") for i in data.draw(st.lists(st.integers(41, 60), unique=True, max_size=10))], "w")
    members = assign_ranks(survivors, newcomers)
    keys = order_keys(members, previous)
    assert all(a < b for a, b in zip(keys, keys[1:]))
    assert all(keys[i] == previous[s.worker_id] for i, s in enumerate(survivors))
    assert all(key > max(previous.values(), default=-1) for key in keys[len(survivors):])


def test_a_member_out_of_its_old_order_gets_a_new_key() -> None:
    """Not what `assign_ranks` does, but keys still rise: the members after it get new ones too."""
    members = assign_ranks(_workers([(2, "a"), (1, "a"), (3, "b")], "w"), [])
    assert order_keys(members, {"w1": 0, "w2": 1, "w3": 2}) == (1, 3, 4)


@given(slots, slots)
def test_appended_ranks_are_those_assign_ranks_gives_the_newcomers(survivor_pairs, newcomer_pairs) -> None:
    """A newcomer's likely place is computed from the hosts' counts alone (`appended_ranks`): the
    same place the whole assignment gives it, wherever its host comes in the order."""
    survivors = _workers(survivor_pairs, "s")
    newcomers = _workers(newcomer_pairs, "n")
    whole = assign_ranks(survivors, newcomers)
    assert appended_ranks(host_counts(s.host for s in survivors), newcomers) == whole[len(survivors):]


def test_host_counts_keep_the_order_hosts_first_appear_in() -> None:
    assert list(host_counts(["b", "a", "b", "c", "a"]).items()) == [("b", 2), ("a", 2), ("c", 1)]
