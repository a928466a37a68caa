"""The pure parts of keeping replicas identical: state digests, the guard's comparison, the sync
plan's reset flag; and the state handlers in one process (a job of one)."""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

import ringmaster.torch as hvd
from ringmaster.checkpoint.digest import buffers_digest, entry_digests, tree_digest
from ringmaster.worker.train.replica_guard import SLOTS, describe, differences, group_differences, pack
from ringmaster.worker.train.state_sync import plan


def test_tree_digest_sees_every_value_type_and_place_but_not_dict_order() -> None:
    base = {"w": torch.tensor([1.0, 2.0]), "groups": [{"lr": 0.1, "momentum": 0.9}], "epoch": 3}
    assert tree_digest(base) == tree_digest({"epoch": 3, "groups": [{"momentum": 0.9,
                                                                     "lr": 0.1}], "w": torch.tensor([1.0, 2.0])})
    assert tree_digest(base) == tree_digest(OrderedDict(reversed(list(base.items()))))
    changed = [
        dict(base, w=torch.tensor([2.0, 1.0])),  # swapped values (a sum of words would not see it)
        dict(base, w=torch.tensor([1.0, 2.0], dtype=torch.float64)),  # same numbers, another dtype
        dict(base, w=torch.tensor([[1.0, 2.0]])),  # another shape
        dict(base, groups=[{"lr": math.nextafter(0.1, 1.0), "momentum": 0.9}]),  # the next float up
        dict(base, epoch=3.0),  # same value, another type
        dict(base, epoch=True),
        dict(base, groups=({"lr": 0.1, "momentum": 0.9},)),  # tuple instead of list
    ]
    digests = {tree_digest(c) for c in changed}
    assert tree_digest(base) not in digests and len(digests) == len(changed)
    assert tree_digest({"x": 0.0}) != tree_digest({"x": -0.0})


def test_buffer_digest_covers_every_byte_in_order() -> None:
    a = torch.arange(1000, dtype=torch.float32)
    b = a.clone()
    b[[3, 700]] = b[[700, 3]]  # two values trade places
    assert buffers_digest([a]) != buffers_digest([b])
    assert buffers_digest([a]) == buffers_digest([a.clone()])
    assert buffers_digest([a[:500], a[500:]]) != buffers_digest([a[500:], a[:500]])
    assert buffers_digest([torch.zeros(0)]) != buffers_digest([])


def test_guard_names_the_entries_and_ranks_that_differ() -> None:
    same = {"model": 1, "optimizer": 2, "epoch": 3}
    vectors = [pack(same), pack(same), pack(dict(same, optimizer=5)), pack(dict(same, model=7, epoch=8))]
    assert all(len(v) == SLOTS for v in vectors)
    found = differences(vectors, list(same))
    assert found == {2: ("optimizer",), 3: ("epoch", "model")}
    assert describe(found) == "rank 2: optimizer; rank 3: epoch, model"
    assert differences([pack(same), pack({"model": 1})], list(same)) == {1: ("the set of state entries",)}
    assert differences([pack(same)] * 3, list(same)) == {}


def test_in_groups_shards_are_compared_within_their_shard_index_and_plain_entries_across_the_ring() -> None:
    """2 groups of 2: ranks 0 and 2 hold shard index 0, ranks 1 and 3 index 1; shards of
    different indices differ by nature, plain entries must not differ anywhere."""
    plain = {"step": 5, "sampler": 9}
    shard = [{"model": 10, "optimizer": 20}, {"model": 11, "optimizer": 21}]  # by shard index
    vectors = [pack(plain) + pack(shard[rank % 2]) for rank in range(4)]
    assert group_differences(vectors, list(plain), list(shard[0]), 2) == {}
    vectors[3] = pack(plain) + pack(dict(shard[1], optimizer=99))  # rank 3's shards against rank 1's
    vectors[2] = pack(dict(plain, step=6)) + pack(shard[0])  # rank 2's plain entries against rank 0's
    assert group_differences(vectors, list(plain), list(shard[0]), 2) == {2: ("step",), 3: ("optimizer",)}
    vectors[1] = pack(plain) + pack(dict(shard[1], model=0))  # the first of index 1 differs: the others do
    assert group_differences(vectors, list(plain), list(shard[0]), 2) == {2: ("step",), 3: ("model", "optimizer")}
    one_group = [pack(plain) + pack(shard[rank]) for rank in range(2)]  # a single group: nothing to compare shards with
    assert group_differences(one_group, list(plain), list(shard[0]), 2) == {}


def test_guard_folds_entries_past_its_slots_into_the_last() -> None:
    many = {f"attr{i:03d}": i for i in range(100)}
    other = dict(many, attr099=-1)
    found = differences([pack(many), pack(other)], list(many))
    assert list(found) == [1] and "attr099" in found[1][0] and "attr062" in found[1][0]


def test_sync_plan_says_whether_any_rank_went_through_a_reset() -> None:
    same = (1, 2, 3)
    assert not plan([(*same, 0), (*same, 0)], 0).after_reset
    assert plan([(*same, 0), (*same, 1)], 0).after_reset  # a survivor tells the newcomer
    the_plan = plan([(*same, 1), (9, 2, 3, 0)], 0)
    assert the_plan.after_reset and the_plan.skeleton_to == (1,) and the_plan.tensors_to == ()


def test_a_scheduler_in_the_state_rolls_back_with_its_optimizer(alone) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, scheduler=scheduler, epoch=0)
    optimizer.step()
    scheduler.step()
    state.commit()
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    state.restore()
    # restored in place, not replaced by a copy
    assert state.scheduler is scheduler and scheduler.optimizer is optimizer
    assert scheduler.last_epoch == 1 and optimizer.param_groups[0]["lr"] == 0.5
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.25  # the live scheduler still drives the live optimizer
    assert entry_digests(state._entries())["scheduler"] == tree_digest(scheduler.state_dict())


def test_assigning_a_handled_attribute_hands_the_object_to_its_handler(alone) -> None:
    state = hvd.elastic.TorchState(model=torch.nn.Linear(2, 1))
    replacement = torch.nn.Linear(2, 1)
    with torch.no_grad():
        replacement.weight.fill_(7.0)
    state.model = replacement
    state.commit()
    with torch.no_grad():
        replacement.weight.fill_(0.0)
    state.restore()
    assert torch.equal(replacement.weight, torch.full((1, 2), 7.0))


def test_a_job_of_one_passes_its_own_replica_guard(alone) -> None:
    calls = []
    state = hvd.elastic.TorchState(model=torch.nn.Linear(2, 1), epoch=0)
    state.register_reset_callbacks([lambda: calls.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        state.epoch += 1
        state.commit()
        return state.epoch

    assert train(state) == 1
    assert calls == []  # the job's first start is no reset
