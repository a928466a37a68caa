"""Which rank's commit a state sync hands out: the newest in the ring, never an older one.

Pure: the plan from the ranks' fingerprints (objects and layout, layout, bytes, reset flag,
commit count). The real ring's version of the same is in tests/e2e/test_e2e.py
(`test_collectives_on_a_real_ring`, "newest-not-rank-0")."""

from __future__ import annotations

from ringmaster.worker.train.state_sync import newest, plan

OLD, NEW, FRESH = (1, 2, 3), (4, 5, 6), (7, 8, 9)


def test_the_rank_with_the_most_commits_is_the_root_wherever_it_is() -> None:
    # A worker back from a ring it left long ago got rank 0; rank 2 holds the job's newest commit.
    the_plan = plan([(*OLD, 1, 51), (*FRESH, 0, 0), (*NEW, 1, 91)])
    assert the_plan.root == 2
    assert the_plan.skeleton_to == (0, 1) and the_plan.tensors_to == (0, 1)


def test_ties_go_to_the_lowest_rank_so_rank_0_leads_whenever_it_holds_the_newest() -> None:
    assert newest([(*NEW, 0, 7), (*OLD, 0, 7), (*FRESH, 0, 0)]) == 0
    assert newest([(*FRESH, 0, 0), (*NEW, 0, 7), (*OLD, 0, 7)]) == 1
    assert plan([(*NEW, 0, 0), (*FRESH, 0, 0)]).root == 0  # nobody committed yet: rank 0's initial state


def test_survivors_equal_to_the_newest_receive_nothing() -> None:
    # A failure between two ranks' commits of one step: rank 1 committed it, rank 0 not yet.
    the_plan = plan([(*OLD, 1, 90), (*NEW, 1, 91), (*NEW, 1, 91)])
    assert the_plan.root == 1 and the_plan.tensors_to == (0,) and the_plan.skeleton_to == (0,)


def test_fingerprints_without_a_count_keep_rank_0_as_the_root() -> None:
    assert plan([(*NEW, 0), (*OLD, 0)]).root == 0
    assert plan([(*NEW, 0), (*OLD, 0)], root=1).tensors_to == (0,)
