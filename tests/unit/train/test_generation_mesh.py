"""A generation's HSDP mesh (`generation_mesh.hsdp_mesh`) makes each slice once: FSDP2 slices it
for every parameter it shards, and every member builds its model again on each generation's mesh
while the ring waits. One process, over torch's fake process group (what is checked is which
mesh objects FSDP2 holds, not communication); the sharded e2e tests train on the real one."""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from ringmaster.torch.elastic.generation_mesh import MESH_DIMS, hsdp_mesh


@pytest.fixture()
def fake_world():
    """Rank 1 of a world of 4 over torch's fake process group, destroyed after the test."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (torch's "fake" backend)

    dist.init_process_group("fake", store=dist.HashStore(), rank=1, world_size=4)
    yield
    dist.destroy_process_group()


def test_a_slice_is_made_once_and_equals_torchs_own(fake_world) -> None:
    mesh = hsdp_mesh("cpu", 2, 2, timedelta(seconds=60))
    shard = mesh["shard"]
    assert mesh["shard"] is shard and mesh[("shard",)] is shard
    assert mesh["replicate"] is not shard and mesh[MESH_DIMS] is mesh
    plain = DeviceMesh.__getitem__(mesh, "shard")  # (torch's own slice, made afresh)
    assert plain is not shard and plain == shard
    assert shard.get_group() is plain.get_group() and shard.mesh.tolist() == [0, 1]
    assert mesh["replicate"].mesh.tolist() == [1, 3]


def test_a_pickled_mesh_slices_afresh(fake_world) -> None:
    mesh = hsdp_mesh("cpu", 2, 2, timedelta(seconds=60))
    kept = mesh["shard"]
    copy = pickle.loads(pickle.dumps(mesh))
    assert "_ringmaster_slices" not in copy.__dict__
    assert copy == mesh and copy["shard"] == kept and copy["shard"] is not kept


def test_fsdp2_shards_every_parameter_on_one_slice(fake_world) -> None:
    """Without kept slices FSDP2 makes a mesh per parameter (six here, 51 for bench/sharded.py's
    transformer, half the time of building it)."""
    mesh = hsdp_mesh("cpu", 2, 2, timedelta(seconds=60))
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 4))
        for layer in (model[0], model[2], model[3]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    params = [param for module in model.modules() if isinstance(module, FSDPModule)
              for group in [module._get_fsdp_state()._fsdp_param_group] if group is not None
              for param in group.fsdp_params]
    assert len(params) == 6
    assert len({id(param.shard_mesh) for param in params}) == 1
    assert params[0].shard_mesh is mesh["shard"]
