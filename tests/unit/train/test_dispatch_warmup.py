"""A newcomer's DTensor dispatch warmed on a fake mesh (`dispatch_warmup`): the optimizer's step on
a mesh of that shape then finds every sharding decision kept, whatever process groups the mesh
has; nothing of the warm-up stays behind (process group, random state); a build or an optimizer
the meta device cannot run is skipped. One process, over torch's fake process group; the e2e
test of replica groups checks it on a real newcomer (its first step works nothing out)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from ringmaster.torch.elastic import dispatch_cache, generation_mesh
from ringmaster.torch.elastic.dispatch_warmup import likely_mesh, stepped_on_fake_mesh
from ringmaster.torch.elastic.generation_mesh import hsdp_mesh
from ringmaster.torch.elastic.groups import ReplicaGroup


def _builder(width: int):
    """A build whose parameters have shapes no other test uses (DTensor's decisions are kept per
    process, by shape)."""
    def build(mesh) -> dict:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(width, width + 2), nn.Tanh(), nn.Linear(width + 2, 3))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.01)}
    return build


@pytest.fixture()
def propagations(monkeypatch):
    """How many sharding decisions DTensor works out (not found kept): torch's method, counted."""
    count = [0]
    worked_out = ShardingPropagator.propagate_op_sharding_non_cached

    def counted(self, *args, **kwargs):
        count[0] += 1
        return worked_out(self, *args, **kwargs)

    monkeypatch.setattr(ShardingPropagator, "propagate_op_sharding_non_cached", counted)
    return count


@pytest.fixture(autouse=True)
def fresh_record(monkeypatch) -> None:
    monkeypatch.setattr(dispatch_cache, "_made_at", {})  # (the ranks the process' earlier meshes had)


def _optimizer_step_on_a_new_mesh(build, groups: int, k: int, rank: int, propagations: list[int]) -> int:
    """Decisions worked out by the optimizer's first step on another mesh of that shape (new
    process groups, real memory, noted as `generation_mesh.mesh()` notes it): what a newcomer's
    first training step would work out."""
    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=groups * k)
    try:
        mesh = hsdp_mesh("cpu", groups, k, timedelta(seconds=60))
        dispatch_cache.entering((groups, k), rank)
        objects = build(mesh)
        for parameter in objects["model"].parameters():
            parameter.grad = torch.ones_like(parameter)
        before = propagations[0]
        objects["optimizer"].step()
        return propagations[0] - before
    finally:
        dist.destroy_process_group()


def test_an_optimizer_step_on_a_mesh_of_the_warmed_shape_works_nothing_out(propagations) -> None:
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (torch's "fake" backend)

    cold = _optimizer_step_on_a_new_mesh(_builder(37), 2, 2, 1, propagations)
    assert cold > 0  # (the probe counts: a shape never seen is worked out)
    build = _builder(41)
    random_state = torch.random.get_rng_state()
    assert stepped_on_fake_mesh(build, 2, 2, 3)
    assert not dist.is_initialized()  # (the mesh the generation builds is torch's default group)
    assert torch.equal(torch.random.get_rng_state(), random_state)  # (build() seeds it)
    assert _optimizer_step_on_a_new_mesh(build, 2, 2, 3, propagations) == 0
    assert _optimizer_step_on_a_new_mesh(build, 3, 2, 3, propagations) > 0  # (another shape: another key)


def test_a_warm_up_at_another_rank_is_dropped_and_the_first_step_works_it_out(propagations) -> None:
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

    build = _builder(43)
    assert stepped_on_fake_mesh(build, 2, 2, 1)
    assert _optimizer_step_on_a_new_mesh(build, 2, 2, 3, propagations) > 0  # (placed at 3, not the 1 it was told)


def _place_of_a_result(rank: int, note: bool) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """Where DTensor says the result of an elementwise operation sits, on a (2, 2) mesh as `rank`:
    its mesh coordinate and its shard's offset in the whole tensor (where DCP would write it)."""
    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=4)
    try:
        mesh = hsdp_mesh("cpu", 2, 2, timedelta(seconds=60))
        if note:
            dispatch_cache.entering((2, 2), rank)
        x = DTensor.from_local(torch.ones(3, 47), mesh, (Replicate(), Shard(0)), run_check=False)
        result = cast(DTensor, x.mul(2.0))
        coordinate = result.device_mesh.get_coordinate()
        _, offset = compute_local_shape_and_global_offset(result.shape, result.device_mesh, result.placements)
        return (None if coordinate is None else tuple(coordinate)), tuple(offset)
    finally:
        dist.destroy_process_group()


def test_a_decision_kept_from_another_rank_would_place_a_result_at_that_ranks_shard() -> None:
    """Why `dispatch_cache` drops what was kept at another rank (torch 2.13's behaviour, checked here
    so that a torch that changes it is noticed): the result carries the mesh the decision was made
    on, and with it that rank's coordinate and shard offset."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

    assert _place_of_a_result(0, note=True) == ((0, 0), (0, 0))
    assert _place_of_a_result(3, note=False) == ((0, 0), (0, 0))  # (rank 3 sits at (1, 1), its shard at row 3)
    assert _place_of_a_result(3, note=True) == ((1, 1), (3, 0))  # (noted: what rank 0 kept is dropped)
    assert _place_of_a_result(3, note=True) == ((1, 1), (3, 0))  # (and what rank 3 keeps is kept)


def test_a_generations_mesh_at_a_new_rank_drops_what_was_kept_at_the_old_one(monkeypatch) -> None:
    """`hvd.elastic.mesh()` itself, in two generations of a (2, 2) mesh, this worker at rank 0 and
    then at rank 3 (a survivor moved up the ring). One process stands in for the world of 4: its
    process group is torch's fake one (what is checked is where DTensor places a result, not a
    collective)."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

    real_init = dist.init_process_group
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: real_init("fake", **kwargs))
    places = []
    for generation, rank in ((5, 0), (6, 3)):
        monkeypatch.setattr(generation_mesh, "context", lambda generation=generation: SimpleNamespace(
            assignment=SimpleNamespace(generation=generation), store=None, backend="gloo", timeout_s=60, link=None))
        monkeypatch.setattr(generation_mesh, "replica_group", lambda rank=rank: ReplicaGroup(rank // 2, 2, rank % 2, 2))
        mesh = generation_mesh.mesh()
        try:
            x = DTensor.from_local(torch.ones(3, 53), mesh, (Replicate(), Shard(0)), run_check=False)
            result = cast(DTensor, x.mul(2.0))
            places.append(compute_local_shape_and_global_offset(result.shape, result.device_mesh, result.placements)[1])
        finally:
            del mesh, x, result
            generation_mesh.release()
    assert places == [(0, 0), (3, 0)]  # (rank 3's shard starts at row 3: not rank 0's, kept from before)


def test_a_build_or_an_optimizer_the_meta_device_cannot_run_is_skipped() -> None:
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

    def data_dependent(mesh) -> dict:
        model = nn.Linear(4, 4)
        if model.weight.sum() > 0:  # (a value: meta tensors have none)
            pass
        return {"model": model}

    def reads_values(mesh) -> dict:
        model = nn.Linear(4, 4)
        fully_shard(model, mesh=mesh)

        class ReadsValues(torch.optim.SGD):
            def step(self, closure=None):
                return float(next(iter(model.parameters())).detach().full_tensor().sum())
        return {"model": model, "optimizer": ReadsValues(model.parameters(), lr=0.1)}

    assert not stepped_on_fake_mesh(data_dependent, 2, 2, 0)
    assert not stepped_on_fake_mesh(reads_values, 2, 2, 0)
    not_named: Any = lambda mesh: [nn.Linear(2, 2)]  # noqa: E731
    assert not stepped_on_fake_mesh(not_named, 2, 2, 0)  # (not a dict of named objects)
    assert not dist.is_initialized()


@pytest.mark.parametrize("in_ring, by_rendezvous, backend, rank, size, k, expected", [
    (False, True, "gloo", 5, 8, 2, (4, 2, 5)),  # a newcomer: 4 groups of 2, as rank 5
    (False, True, "gloo", 0, 4, 4, (1, 4, 0)),
    (True, True, "gloo", 5, 8, 2, None),  # in a ring already: a survivor, or warm
    (False, False, "gloo", 0, 1, 1, None),  # not started by a rendezvous: no tentative size
    (False, True, "nccl", 5, 8, 2, None),  # a GPU job: see the module's docstring
    (False, True, "gloo", 5, 7, 2, None),  # no whole number of groups
    (False, True, "gloo", 0, 1, 2, None),  # fewer workers than a group
    (False, True, "gloo", 8, 8, 2, None),  # a rank outside the size
    (False, True, "gloo", 0, 8, 0, None),
])
def test_the_mesh_to_warm_is_the_newcomers_tentative_one_in_whole_groups(in_ring, by_rendezvous, backend, rank, size,
                                                                          k, expected) -> None:
    assert likely_mesh(in_ring, by_rendezvous, backend, rank, size, k) == expected
