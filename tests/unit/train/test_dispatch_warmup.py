"""A newcomer's DTensor dispatch warmed on a fake mesh (`dispatch_warmup`): the optimizer's step on
a mesh of that shape then finds every sharding decision kept, whatever process groups the mesh
has; nothing of the warm-up stays behind (process group, random state); a build or an optimizer
the meta device cannot run is skipped. One process, over torch's fake process group; the e2e
test of replica groups checks it on a real newcomer (its first step works nothing out)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor._sharding_prop import ShardingPropagator

from ringmaster.torch.elastic.dispatch_warmup import likely_mesh, stepped_on_fake_mesh
from ringmaster.torch.elastic.generation_mesh import hsdp_mesh


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


def _optimizer_step_on_a_new_mesh(build, groups: int, k: int, rank: int, propagations: list[int]) -> int:
    """Decisions worked out by the optimizer's first step on another mesh of that shape (new
    process groups, real memory): what a newcomer's first training step would work out."""
    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=groups * k)
    try:
        objects = build(hsdp_mesh("cpu", groups, k, timedelta(seconds=60)))
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
    assert _optimizer_step_on_a_new_mesh(build, 2, 2, 1, propagations) == 0
    assert _optimizer_step_on_a_new_mesh(build, 3, 2, 1, propagations) > 0  # (another shape: another key)


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
