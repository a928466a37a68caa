"""Which commit a job of sharded replica groups goes on from, and who sends which shard."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringmaster.worker.sharding.shard_plan import (
    NONE,
    Holding,
    SyncProof,
    Transfer,
    consistent_commit,
    equal_by_sync,
    transfers,
)

SAME = (1, 2, 3)  # a fingerprint shared by ranks holding equal bytes


def test_survivors_of_a_failure_all_at_one_commit_move_nothing() -> None:
    holdings = [Holding(0, 0, 7, 6), Holding(1, 1, 7, 6)]
    assert consistent_commit(holdings, 2) == 7
    assert transfers(holdings, [SAME, SAME], 7, 2) == []


def test_a_new_group_gets_each_shard_from_the_old_groups_member_at_its_index() -> None:
    holdings = [Holding(0, 0, 9, 8), Holding(1, 1, 9, 8), Holding(0, 0, 0), Holding(1, 1, 0)]
    assert consistent_commit(holdings, 2) == 9
    assert transfers(holdings, [SAME, SAME, (0,), (0,)], 9, 2) == [Transfer(0, 0, (2,)), Transfer(1, 1, (3,))]


def test_a_member_one_commit_behind_is_sent_the_newer_commit_by_another_group() -> None:
    # group 1's second member failed in commit 5's collective and rolled back to 4; group 0 holds 5
    holdings = [Holding(0, 0, 5, 4), Holding(1, 1, 5, 4), Holding(0, 0, 5, 4), Holding(1, 1, 4, 3)]
    assert consistent_commit(holdings, 2) == 5
    assert transfers(holdings, [SAME] * 4, 5, 2) == [Transfer(1, 1, (3,))]


def test_a_group_alone_with_members_a_commit_apart_goes_back_to_the_older_one() -> None:
    # no other group holds shard 1 of commit 5: the ring goes on from 4, which both hold
    holdings = [Holding(0, 0, 5, 4), Holding(1, 1, 4, 3)]
    assert consistent_commit(holdings, 2) == 4
    assert transfers(holdings, [SAME, SAME], 4, 2) == []


def test_a_partner_placed_at_another_index_receives_that_shard_and_sends_its_own() -> None:
    # ranks 0-1 are a new group: rank 0 is a lost member's partner that committed shard 1 and now
    # sits at index 0, rank 1 a newcomer; ranks 2-3 are the surviving group
    holdings = [Holding(0, 1, 6, 5), Holding(1, 1, 0), Holding(0, 0, 6, 5), Holding(1, 1, 6, 5)]
    assert consistent_commit(holdings, 2) == 6
    plan = transfers(holdings, [SAME] * 4, 6, 2)
    assert plan == [Transfer(0, 2, (0,)), Transfer(1, 0, (1,))]  # rank 0 receives shard 0, sends its shard 1


def test_no_commit_held_whole_is_none_and_transfers_refuse_it() -> None:
    holdings = [Holding(0, 0, 8, 7), Holding(1, 1, 3)]  # shard 1's holders of 7 and 8 are gone
    assert consistent_commit(holdings, 2) is None
    with pytest.raises(ValueError, match="no rank holds shard 1 of commit 8"):
        transfers(holdings, [SAME, SAME], 8, 2)


def test_replicas_whose_bytes_differ_from_the_senders_receive_it() -> None:
    holdings = [Holding(0, 0, 2), Holding(0, 0, 2)]
    assert transfers(holdings, [SAME, (9, 9, 9)], 2, 1) == [Transfer(0, 0, (1,))]


@st.composite
def lineages(draw):
    """A ring after a failure: K shard indices, groups whose members committed N or N+1 (never
    further apart: a commit's collective passes only once all saved it), newcomers at 0."""
    k = draw(st.integers(1, 4))
    groups = draw(st.integers(1, 4))
    n = draw(st.integers(1, 50))
    holdings = []
    for _ in range(groups):
        new = draw(st.booleans()) and groups > 1
        for index in range(k):
            if new:
                holdings.append(Holding(index, index, 0))
            else:
                ahead = draw(st.booleans())
                holdings.append(Holding(index, index, n + 1, n) if ahead else Holding(index, index, n, n - 1))
    return k, holdings


@given(lineages())
@settings(max_examples=150, deadline=None)
def test_every_rank_ends_holding_its_index_of_the_chosen_commit(case) -> None:
    k, holdings = case
    count = consistent_commit(holdings, k)
    assert count is not None
    assert all(any(h.holds(count, i) for h in holdings) for i in range(k))
    newer = count + 1
    assert not all(any(h.holds(newer, i) for h in holdings) for i in range(k)), "a newer whole commit was passed over"
    plan = transfers(holdings, [SAME] * len(holdings), count, k)
    receivers = {r for t in plan for r in t.to}
    for rank, h in enumerate(holdings):
        assert (rank in receivers) == (not h.holds(count, h.index))
    for t in plan:
        assert holdings[t.root].holds(count, t.index)
        assert all(holdings[r].index == t.index for r in t.to)


def test_none_means_no_previous_commit() -> None:
    assert Holding(0, 0, 3).previous == NONE and not Holding(0, 0, 3).holds(NONE, 0)


LOADED = SyncProof(plain=5, loads=True, covers=True, callbacks=False)


def test_a_sync_that_loaded_equal_commits_everywhere_proves_the_replicas_equal() -> None:
    # two survivors loaded the commit they hold, two newcomers receive it: nothing left to compare
    newcomer = SyncProof(plain=0, loads=False, covers=False, callbacks=False)  # (its own blind build: replaced)
    plan = [Transfer(0, 0, (2,)), Transfer(1, 1, (3,))]
    assert equal_by_sync([LOADED, LOADED, newcomer, newcomer], plan, resumed=False)
    assert equal_by_sync([LOADED, LOADED], [], resumed=False)  # a group lost: the survivors reloaded theirs


@pytest.mark.parametrize("why, proofs, resumed", [
    ("a reset callback of the script's runs after the load", [LOADED, SyncProof(5, True, True, True)], False),
    ("a holder trains on what it did not load", [LOADED, SyncProof(5, False, True, False)], False),
    ("the plain attributes differ between holders", [LOADED, SyncProof(6, True, True, False)], False),
    ("a holder's commit lacks an object build() made", [LOADED, SyncProof(5, True, False, False)], False),
    ("the ring resumed from disk", [LOADED, LOADED], True),
    ("no rank", [], False),
])
def test_the_replica_guard_still_compares_when_the_sync_cannot_prove_equality(why, proofs, resumed) -> None:
    assert not equal_by_sync(proofs, [], resumed), why


def test_a_receivers_own_plain_entries_do_not_count_it_takes_the_senders() -> None:
    stale = SyncProof(plain=99, loads=False, covers=True, callbacks=False)
    assert equal_by_sync([LOADED, stale], [Transfer(0, 0, (1,))], resumed=False)
    assert not equal_by_sync([LOADED, SyncProof(99, False, True, True)], [Transfer(0, 0, (1,))], resumed=False)


def test_newcomers_that_built_blind_hold_nothing_so_a_ring_of_only_them_has_no_commit() -> None:
    # every holder of commit 9 died while the new group was receiving it: the newcomers' blind
    # builds (memory never written) are not a "commit 0" to go on from
    holdings = [Holding(0, 0, NONE), Holding(1, 1, NONE)]
    assert consistent_commit(holdings, 2) is None
    # with a holder left, the newcomers receive from it as before
    assert consistent_commit([*holdings, Holding(0, 0, 9, 8), Holding(1, 1, 9, 8)], 2) == 9
