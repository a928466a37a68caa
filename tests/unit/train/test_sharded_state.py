"""`ShardedState`'s pieces on real FSDP2 modules: a commit of the local shards loaded into a fresh
model and optimizer (built again, as in every generation) continues training bit for bit; a
model built differently is refused by name; bad `build` functions are refused with what to do;
DCP checkpoints written and loaded back into rebuilt objects, listed only when whole, refused
when they do not fit or hold planted code. One process, torch's default group of one over a
HashStore."""

from __future__ import annotations

import pickle
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ringmaster.checkpoint.directory import UntrustedCheckpointError
from ringmaster.checkpoint.memory import HostSnapshot
from ringmaster.checkpoint.policy import CheckpointPolicy
from ringmaster.torch.elastic import ElasticSampler, ShardedState
from ringmaster.torch.elastic.handlers import sharded_handler_for
from ringmaster.torch.elastic.sharded_state import _built_empty, _check_received
from ringmaster.worker.sharding import kept_memory, no_init
from ringmaster.worker.sharding.shard_plan import Transfer
from ringmaster.worker.sharding.sharded_checkpoint import ShardedCheckpoints
from ringmaster.worker.train.errors import CheckpointMismatchError, ReplicasDivergedError
from ringmaster.worker.train.state_sync import fingerprint


@pytest.fixture()
def mesh():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    finally:
        dist.destroy_process_group()


def _build(mesh, hidden: int = 16) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.01)}


def _train(objects: dict, steps: range) -> None:
    for step in steps:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        objects["model"](x).square().mean().backward()
        objects["optimizer"].step()
        objects["optimizer"].zero_grad()


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.to_local().detach().clone() if isinstance(p, DTensor) else p.detach().clone() for p in model.parameters()]


def _commit(objects: dict) -> tuple[HostSnapshot, dict]:
    handlers = {name: sharded_handler_for(name, value) for name, value in objects.items()}
    snapshot = HostSnapshot()
    snapshot.capture({name: h.state_dict() for name, h in handlers.items()})
    return snapshot, handlers


def _committed_then_trained(mesh, steps: int) -> tuple[HostSnapshot, list[torch.Tensor]]:
    """A commit after `steps` steps, and the parameters `steps` steps more reach from it."""
    first = _build(mesh)
    _train(first, range(steps))
    snapshot, _ = _commit(first)
    _train(first, range(steps, 2 * steps))
    return snapshot, _params(first["model"])


def _load(objects: dict, snapshot: HostSnapshot) -> None:
    for name, value in objects.items():
        sharded_handler_for(name, value).load(snapshot, name)


def test_a_commit_loaded_into_a_model_and_optimizer_built_again_trains_on_bit_for_bit(mesh) -> None:
    snapshot, expected = _committed_then_trained(mesh, 3)
    again = _build(mesh)  # a new generation: new objects, the optimizer without state
    assert not again["optimizer"].state
    _load(again, snapshot)
    moments = next(iter(again["optimizer"].state.values()))
    assert isinstance(moments["exp_avg"], DTensor), "the optimizer's state is sharded as its parameters"
    _train(again, range(3, 6))
    assert all(torch.equal(a, b) for a, b in zip(_params(again["model"]), expected))


def test_a_model_built_without_initializing_then_loaded_trains_on_bit_for_bit(mesh) -> None:
    """A survivor's rebuild after a reset skips torch.nn.init (the commit overwrites every value)."""
    snapshot, expected = _committed_then_trained(mesh, 2)
    probe = torch.full((3,), 7.0)
    with no_init.skipped():
        assert torch.equal(nn.init.normal_(probe), torch.full((3,), 7.0))  # left as it is
        again = _build(mesh)
    assert not torch.equal(nn.init.normal_(probe), torch.full((3,), 7.0))  # and back after it
    _load(again, snapshot)
    _train(again, range(2, 4))
    assert all(torch.equal(a, b) for a, b in zip(_params(again["model"]), expected))


def test_a_model_built_on_the_meta_device_then_given_memory_and_loaded_trains_on_bit_for_bit(mesh) -> None:
    """A rebuild whose every value a commit overwrites: built on the meta device, then given
    memory in place (the optimizer built with it holds the same parameters)."""
    snapshot, expected = _committed_then_trained(mesh, 2)
    built, fresh = _built_empty(_build, mesh)
    assert fresh > 0  # (no kept memory: every tensor fresh)
    assert built is not None
    again = dict(built)
    params = list(again["model"].parameters())
    assert all(p.to_local().device.type == "cpu" for p in params)
    assert [id(p) for p in params] == [id(p) for g in again["optimizer"].param_groups for p in g["params"]]
    assert not torch.__future__.get_swap_module_params_on_conversion()  # (torch's setting put back)
    _load(again, snapshot)
    _train(again, range(2, 4))
    assert all(torch.equal(a, b) for a, b in zip(_params(again["model"]), expected))


class _WithMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("mask", torch.ones(4), persistent=False)  # (no commit holds it)


class _WithTensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.scale = torch.ones(4)  # (a plain attribute: to_empty does not give it memory)


class _WithCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.cache = {"table": [torch.ones(4)]}  # (nor one in a container)


def test_what_the_meta_device_cannot_rebuild_is_built_the_usual_way(mesh) -> None:
    def of(module_type):
        return lambda m: {"model": fully_shard(module_type(), mesh=m)}

    def data_dependent(m):
        model = fully_shard(nn.Linear(4, 4), mesh=m)
        if float(model.weight.to_local().sum()) > 1e9:  # (.item() of a meta tensor raises)
            pass
        return {"model": model}

    for build in (of(_WithMask), of(_WithTensor), of(_WithCache), data_dependent, lambda m: {"x": 1}, lambda m: None):
        assert _built_empty(build, mesh) is None
    assert not torch.__future__.get_swap_module_params_on_conversion()


def test_the_heap_is_frozen_once_and_only_in_a_worker_a_rendezvous_started(monkeypatch) -> None:
    import gc

    from ringmaster.torch.elastic import generation_mesh

    monkeypatch.delenv("RINGMASTER_RENDEZVOUS", raising=False)
    monkeypatch.setitem(generation_mesh._built, "frozen", False)
    generation_mesh.freeze_heap()
    assert gc.get_freeze_count() == 0  # a test or a notebook keeps its collector as it was
    monkeypatch.setenv("RINGMASTER_RENDEZVOUS", "127.0.0.1:1")
    try:
        generation_mesh.freeze_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        generation_mesh.freeze_heap()
        assert gc.get_freeze_count() == frozen  # once per process
    finally:
        gc.unfreeze()


def test_a_scheduler_that_build_returns_is_committed_and_loaded_as_the_state_loads_it(mesh) -> None:
    """The replica-groups guide lets build(mesh) return a learning-rate scheduler: a commit of it
    loads (as ShardedState loads every object: held, with its kept memory) into the scheduler
    built again, its step count and learning rate those of the commit. It raised TypeError."""
    def build(mesh) -> dict:
        objects = _build(mesh)
        objects["schedule"] = torch.optim.lr_scheduler.StepLR(objects["optimizer"], step_size=2, gamma=0.5)
        return objects

    first = build(mesh)
    for step in range(5):
        _train(first, range(step, step + 1))
        first["schedule"].step()
    snapshot, handlers = _commit(first)
    assert handlers["schedule"].memory() is None
    for held in (False, True):
        again = build(mesh)
        for name, value in again.items():
            sharded_handler_for(name, value).load(snapshot, name, held=held, kept=None)
        assert again["schedule"].last_epoch == 5 and again["schedule"].get_last_lr() == first["schedule"].get_last_lr()
        assert again["optimizer"].param_groups[0]["lr"] == first["optimizer"].param_groups[0]["lr"] == 0.0025


def test_a_rollback_loads_the_commit_in_place_into_the_live_objects(mesh) -> None:
    objects = _build(mesh)
    _train(objects, range(2))
    snapshot, handlers = _commit(objects)
    committed = _params(objects["model"])
    live_param = objects["model"][0].weight
    _train(objects, range(2, 4))
    for name, handler in handlers.items():
        handler.load(snapshot, name)
    assert objects["model"][0].weight is live_param
    assert all(torch.equal(a, b) for a, b in zip(_params(objects["model"]), committed))


def test_shards_of_another_model_are_refused_naming_the_entry(mesh) -> None:
    snapshot, _ = _commit(_build(mesh))
    other = _build(mesh, hidden=32)
    with pytest.raises(CheckpointMismatchError, match="'model' do not fit .*build\\(mesh\\) must make the same model"):
        sharded_handler_for("model", other["model"]).load(snapshot, "model")


def test_bad_builds_are_refused_with_what_to_do() -> None:
    with pytest.raises(TypeError, match="takes a function build\\(mesh\\) first"):
        ShardedState(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="returned sampler=list: give modules, optimizers and learning-rate"):
        sharded_handler_for("sampler", [1, 2])


def _folder(tmp_path, keep: int = 3) -> ShardedCheckpoints:
    return ShardedCheckpoints(tmp_path / "ck", CheckpointPolicy(every=1), keep, trusted=False)


def test_a_dcp_checkpoint_loads_into_objects_built_again_and_training_goes_on_bit_for_bit(mesh, tmp_path) -> None:
    first = _build(mesh)
    _train(first, range(3))
    folder = _folder(tmp_path)
    folder.write(first, {"step": 3, "note": "three"}, 3, 0, {"world_size": 1, "group_size": 1, "generation": 2})
    _train(first, range(3, 5))
    expected = _params(first["model"])
    again = _build(mesh)
    [path] = folder.checkpoints()
    assert path.name == "sharded-step-000000000003"
    values = folder.load(path, again, {"step": 0, "note": ""})
    assert values == {"step": 3, "note": "three",
                      "ringmaster": {"commits": 3, "world_size": 1, "group_size": 1, "generation": 2}}
    assert isinstance(next(iter(again["optimizer"].state.values()))["exp_avg"], DTensor)
    _train(again, range(3, 5))
    assert all(torch.equal(a, b) for a, b in zip(_params(again["model"]), expected))


def test_only_whole_checkpoints_are_listed_and_the_oldest_beyond_keep_go(mesh, tmp_path) -> None:
    objects = _build(mesh)
    folder = _folder(tmp_path, keep=2)
    for commits in (1, 2, 3):
        folder.write(objects, {}, commits, 0, {})
    (folder.path / "sharded-step-000000000009.partial").mkdir()  # a crash halfway through a write
    (folder.path / "sharded-step-000000000008").mkdir()  # no .metadata: DCP never finished it
    assert [p.name for p in folder.checkpoints()] == ["sharded-step-000000000003", "sharded-step-000000000002"]


def test_a_checkpoint_of_another_model_is_refused_naming_it(mesh, tmp_path) -> None:
    folder = _folder(tmp_path)
    folder.write(_build(mesh), {}, 1, 0, {})
    with pytest.raises(CheckpointMismatchError, match="sharded-step-000000000001 does not fit this model"):
        folder.load(folder.checkpoints()[0], _build(mesh, hidden=32), {})


def planted_payload(note: str) -> None:
    """What a planted checkpoint would run when unpickled: the tests see it in the captured output.

    A function of this module's, not ``print``: pickle names a function by where it is found now,
    and Ray (imported by other tests in the same xdist worker) replaces ``builtins.print`` with its
    own, so ``print`` was pickled as ``ray.experimental.tqdm_ray.safe_print`` in CI.
    """
    print(note)


PLANTED_NAME = re.escape(f"{planted_payload.__module__}.{planted_payload.__qualname__}")


class Planted:
    """An object whose unpickling would run code (any class outside plain data)."""

    def __reduce__(self):
        return (planted_payload, ("planted code ran",))


def test_planted_code_in_the_metadata_or_the_values_is_refused_unless_trusted(mesh, tmp_path, capsys) -> None:
    folder = _folder(tmp_path)
    folder.write(_build(mesh), {"extra": Planted()}, 1, 0, {})
    path = folder.checkpoints()[0]
    with pytest.raises(UntrustedCheckpointError,
                       match="'extra' holds objects other than tensors.*--checkpoint-trusted"):
        folder.load(path, _build(mesh), {"extra": None})
    assert "planted code ran" not in capsys.readouterr().out
    (path / ".metadata").write_bytes(pickle.dumps(Planted()))
    with pytest.raises(UntrustedCheckpointError, match=f"holds an object of {PLANTED_NAME}.*--checkpoint-trusted"):
        folder.load(path, _build(mesh), {})
    assert "planted code ran" not in capsys.readouterr().out


def test_a_sampler_deals_by_rank_or_by_group_and_says_so() -> None:
    assert ElasticSampler(range(8)).by == "rank" and ElasticSampler(range(8), by="group").by == "group"
    with pytest.raises(ValueError, match="ElasticSampler\\(by='host'\\): deal by 'rank' or 'group'"):
        ElasticSampler(range(8), by="host")


def test_a_truncated_newest_checkpoint_is_reported_and_the_one_before_used(mesh, tmp_path) -> None:
    folder = _folder(tmp_path)
    objects = _build(mesh)
    for commits in (1, 2):
        folder.write(objects, {}, commits, 0, {})
    newest = folder.checkpoints()[0]
    (newest / ".metadata").write_bytes((newest / ".metadata").read_bytes()[:20])  # cut short
    said: list[str] = []
    assert folder.newest(said.append) == folder.checkpoints()[1]
    assert len(said) == 1 and "sharded-step-000000000002/.metadata cannot be read as DCP metadata" in said[0]
    (folder.checkpoints()[1] / ".metadata").write_bytes(pickle.dumps(Planted()))
    with pytest.raises(UntrustedCheckpointError, match=PLANTED_NAME):
        folder.newest(said.append)  # planted code is refused, never skipped for an older one


def test_fsdp2_modules_given_the_guarded_collectives_train_as_with_torchs_own(mesh) -> None:
    from ringmaster.worker.sharding import fsdp_comms

    plain, guarded = _build(mesh), _build(mesh)
    assert fsdp_comms.guard(guarded, lambda: None) == 3  # both layers and the root
    comm = guarded["model"][0]._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm
    assert isinstance(comm, fsdp_comms.GuardedAllGather)
    _train(plain, range(3))
    _train(guarded, range(3))
    assert all(torch.equal(a, b) for a, b in zip(_params(plain["model"]), _params(guarded["model"])))


def test_a_received_commit_whose_bytes_are_not_the_announced_ones_stops_the_worker(mesh) -> None:
    snapshot, _ = _commit(_build(mesh))
    announced = [fingerprint(snapshot), (0, 0, 0)]  # rank 0 sent it, rank 1 (this one) received it
    _check_received(snapshot, [Transfer(0, 0, (1,))], announced, rank=1)  # the bytes announced: taken
    snapshot.buffers[0][3] += 1  # one value changed on the way
    with pytest.raises(ReplicasDivergedError, match="received from rank 0 does not have the bytes rank 0 announced"):
        _check_received(snapshot, [Transfer(0, 0, (1,))], announced, rank=1)


def test_a_survivors_objects_built_again_take_its_last_generations_memory_and_values(mesh) -> None:
    """A worker that left its generation at a commit builds its objects again on the new mesh
    inside the memory of its old ones: nothing allocated, nothing copied, and training goes on
    bit for bit as from the commit."""
    first = _build(mesh)
    _train(first, range(2))
    snapshot, handlers = _commit(first)
    old = {name: handler.memory() for name, handler in handlers.items()}
    pointers = {t.data_ptr() for t in old["model"].values()} | {t.data_ptr() for t in old["optimizer"]}
    del first, handlers  # (the old objects go, their memory stays held)
    built, fresh = _built_empty(_build, mesh, old)
    assert fresh == 0
    again = dict(built)
    for name, value in again.items():
        sharded_handler_for(name, value).load(snapshot, name, held=True, kept=old.get(name))
    now = {t.data_ptr() for t in kept_memory.local_tensors(again["model"]).values()}
    state = [t for entries in again["optimizer"].state.values() for t in entries.values() if isinstance(t, DTensor)]
    now |= {t.to_local().data_ptr() for t in state}
    assert state and now <= pointers  # the old memory, not new
    reference = _build(mesh)
    _train(reference, range(4))
    _train(again, range(2, 4))
    assert all(torch.equal(a, b) for a, b in zip(_params(again["model"]), _params(reference["model"])))


def test_kept_memory_that_does_not_fit_is_not_used_and_the_commit_is_copied(mesh) -> None:
    snapshot, expected = _committed_then_trained(mesh, 2)
    other = _build(mesh, hidden=32)
    _train(other, range(1))
    old = {name: sharded_handler_for(name, value).memory() for name, value in other.items()}
    built, fresh = _built_empty(_build, mesh, old)
    assert fresh > 0  # (the first layer's and the last one's weights are of other shapes)
    again = dict(built)
    for name, value in again.items():
        sharded_handler_for(name, value).load(snapshot, name, kept=old.get(name))
    _train(again, range(2, 4))
    assert all(torch.equal(a, b) for a, b in zip(_params(again["model"]), expected))
