"""A newcomer's memory reserved while it waits for its place (`newcomer_memory`): the commit a peer
sends it is received into the reserved buffers, its objects built on the real mesh take the
reserved tensors and train on bit for bit, its first own commit goes into the buffers reserved
for it; the pages are touched when reserved; a guess of another shape, or a spare that holds a
commit, is not used. One process: the warm-up over torch's fake process group, the real mesh a
Gloo group of one over a HashStore."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ringmaster.checkpoint.memory import HostSnapshot, copy_tensors, entries_layout
from ringmaster.torch.elastic import ShardedState, dispatch_cache, dispatch_warmup
from ringmaster.torch.elastic.generation_mesh import hsdp_mesh
from ringmaster.torch.elastic.handlers import sharded_handler_for
from ringmaster.torch.elastic.sharded_state import _built_empty
from ringmaster.worker.sharding import kept_memory, newcomer_memory
from ringmaster.worker.sharding.newcomer_memory import NewcomerMemory
from ringmaster.worker.train.context import WorkerContext


def _builder(hidden: int):
    def build(mesh) -> dict:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(12, hidden), nn.Tanh(), nn.Linear(hidden, 5))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.01)}
    return build


def _train(objects: dict, steps: range) -> None:
    for step in steps:
        x = torch.randn(4, 12, generator=torch.Generator().manual_seed(step))
        objects["model"](x).square().mean().backward()
        objects["optimizer"].step()
        objects["optimizer"].zero_grad()


def _entries(objects: dict) -> dict:
    return {name: sharded_handler_for(name, value).state_dict() for name, value in objects.items()}


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.to_local().detach().clone() if isinstance(p, DTensor) else p.detach().clone() for p in model.parameters()]


@pytest.fixture(autouse=True)
def fresh_record(monkeypatch) -> None:
    monkeypatch.setattr(dispatch_cache, "_made_at", {})


def _reserved_on_fake_mesh(build) -> NewcomerMemory:
    """What a newcomer reserves: its objects built on the meta device over the fake process group."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (torch's "fake" backend)

    reserved: list[NewcomerMemory] = []

    def reserve(built) -> None:
        handlers = {name: sharded_handler_for(name, value) for name, value in built.items()}
        reserved.append(newcomer_memory.reserve({name: h.memory() for name, h in handlers.items()},
                                                entries_layout({n: h.state_dict() for n, h in handlers.items()})))

    assert dispatch_warmup.stepped_on_fake_mesh(build, 1, 1, 0, then=reserve)
    assert not dist.is_initialized()
    return reserved[0]


@pytest.fixture()
def real_mesh():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield hsdp_mesh("cpu", 1, 1, timedelta(seconds=60))
    finally:
        dist.destroy_process_group()


def _pointers(tensors) -> set[int]:
    return {t.data_ptr() for t in tensors}


def test_the_commit_sent_the_objects_built_and_the_first_commit_take_the_reserved_memory(request) -> None:
    build = _builder(22)
    reserved = _reserved_on_fake_mesh(build)
    staging = _pointers(reserved.staging.buffers)
    kept = _pointers(reserved.kept["model"].values()) | _pointers(reserved.kept["optimizer"])
    assert staging and len(kept) == len(reserved.kept["model"]) + len(reserved.kept["optimizer"])
    mesh = request.getfixturevalue("real_mesh")

    sender = build(mesh)  # (the peer whose commit the newcomer is sent)
    _train(sender, range(2))
    sent = HostSnapshot()
    sent.capture(_entries(sender))
    _train(sender, range(2, 4))

    mine = HostSnapshot()
    staged = mine.incoming(sent.skeleton, reserved.staging)
    assert _pointers(staged.buffers) == staging and reserved.staging.buffers == []  # (taken, not shared)
    copy_tensors(staged.buffers, sent.buffers)  # (the receive)
    mine.replace(staged)

    built, fresh = _built_empty(build, mesh, reserved.kept)
    assert fresh == 0
    objects = dict(built)
    for name, value in objects.items():
        sharded_handler_for(name, value).load(mine, name, kept=reserved.kept.get(name))
    live = _pointers(kept_memory.local_tensors(objects["model"]).values())
    state = [t.to_local() for entries in objects["optimizer"].state.values() for t in entries.values()
             if isinstance(t, DTensor)]
    assert state and live | _pointers(state) <= kept  # (the reserved tensors, not fresh ones)

    previous = HostSnapshot()
    previous.reserve(mine.layout)
    ahead = _pointers(previous.buffers)
    previous.capture(_entries(objects))  # (its first own commit)
    assert previous.allocations == 1 and _pointers(previous.buffers) == ahead

    _train(objects, range(2, 4))
    assert all(torch.equal(a, b) for a, b in zip(_params(objects["model"]), _params(sender["model"])))


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_reserved_buffers_are_resident_before_anything_is_written_into_them() -> None:
    snapshot = HostSnapshot()
    before = _resident_bytes()
    snapshot.reserve(((((32 << 20) // 4,), torch.float32),))  # (32 MB: its own mapping, not reused heap)
    assert _resident_bytes() - before >= 0.9 * snapshot.nbytes


def test_a_guess_of_another_shape_or_a_spare_holding_a_commit_is_not_received_into(request) -> None:
    reserved = _reserved_on_fake_mesh(_builder(26))
    mesh = request.getfixturevalue("real_mesh")
    other = HostSnapshot()
    other.capture(_entries(_builder(27)(mesh)))  # (the job changed again: another layout)
    staged = HostSnapshot().incoming(other.skeleton, reserved.staging)
    assert not _pointers(staged.buffers) & _pointers(reserved.staging.buffers)
    assert reserved.staging.buffers  # (left as it was, for the sync to drop)
    built, fresh = _built_empty(_builder(27), mesh, reserved.kept)
    assert fresh > 0  # (what does not fit gets fresh memory, as before)

    holding = HostSnapshot()
    holding.capture(_entries(_builder(27)(mesh)))  # (a snapshot that holds a commit is never a spare)
    staged = HostSnapshot().incoming(other.skeleton, holding)
    assert not _pointers(staged.buffers) & _pointers(holding.buffers)
    with pytest.raises(ValueError, match="holds no commit"):
        holding.reserve(holding.layout)


def test_a_newcomers_sharded_state_reserves_its_objects_and_commits_layout(monkeypatch, request) -> None:
    """`ShardedState` made by a newcomer the rendezvous placed tentatively (its context stood in:
    no ring yet, started into a running job)."""
    monkeypatch.setattr(dispatch_warmup, "context", lambda: SimpleNamespace(
        assignment=None, link=object(), tentative_given=True, backend="gloo", topology=lambda: (0, 1, 0, 1, 0, 1)))
    monkeypatch.setattr(dispatch_warmup, "group_size", lambda: 1)
    build = _builder(30)
    state = ShardedState(build, step=0, seen=torch.zeros(7))
    assert state._reserved is not None and set(state._kept_memory) == {"model", "optimizer"}
    mesh = request.getfixturevalue("real_mesh")
    handlers = {name: sharded_handler_for(name, value) for name, value in build(mesh).items()}
    _train({name: h.value for name, h in handlers.items()}, range(1))
    expected = entries_layout(state._entries_of(handlers))  # (what its commits will take, plain `seen` too)
    assert state._reserved.staging.layout == expected and state._previous.layout == expected


def test_a_worker_of_a_jobs_first_ring_reserves_nothing(monkeypatch) -> None:
    assert WorkerContext({"RINGMASTER_RENDEZVOUS": "127.0.0.1:1", "WORLD_SIZE": "4", "RANK": "1"}).tentative_given
    assert not WorkerContext({"RINGMASTER_RENDEZVOUS": "127.0.0.1:1"}).tentative_given
    monkeypatch.setattr(dispatch_warmup, "context", lambda: SimpleNamespace(
        assignment=None, link=object(), tentative_given=False, backend="gloo", topology=lambda: (0, 1, 0, 1, 0, 1)))
    monkeypatch.setattr(dispatch_warmup, "group_size", lambda: 1)
    state = ShardedState(_builder(31), step=0)
    assert state._reserved is None and state._kept_memory == {}


def _committed(hidden: int, mesh, steps: range) -> HostSnapshot:
    objects = _builder(hidden)(mesh)
    _train(objects, steps)
    snapshot = HostSnapshot()
    snapshot.capture(_entries(objects))
    return snapshot


def test_a_returning_member_receives_into_its_commit_before_last_and_commits_next_into_its_old_one(
        request) -> None:
    """The member of a lost group that comes back beside a newcomer holds two stale commits of the
    layout it is sent: the commit arrives in the older one's buffers (over a real Gloo ring of two
    threads), the replaced commit's buffers go to the older one, holding no commit, and its next
    commit is written there: no buffer allocated, the received bytes the sender's."""
    from gloo_rings import on_ranks

    from ringmaster.torch.elastic.sharded_state import _move_shards
    from ringmaster.worker.sharding.shard_plan import Transfer

    mesh = request.getfixturevalue("real_mesh")
    sent = _committed(23, mesh, range(4))
    mine, previous = _committed(23, mesh, range(2)), _committed(23, mesh, range(1))
    older, replaced = _pointers(previous.buffers), _pointers(mine.buffers)
    previous.forget()  # (what `_receive_spare` does with the commit before last of a rank about to receive)

    def move(comm) -> int:
        if comm.rank == 0:
            return _move_shards(sent, comm, [Transfer(0, 0, (1,))])
        return _move_shards(mine, comm, [Transfer(0, 0, (1,))], spare=previous)

    sent_none, received = on_ranks(2, move)
    assert sent_none == 0 and sent.nbytes < received < sent.nbytes + (1 << 20)  # (the bytes, and the skeleton's)
    assert _pointers(mine.buffers) == older and mine.data_digest() == sent.data_digest()
    assert _pointers(previous.buffers) == replaced and previous.skeleton == {} and previous.allocations == 1
    objects = _builder(23)(mesh)
    _train(objects, range(5, 6))
    previous.capture(_entries(objects))  # (its next own commit)
    assert _pointers(previous.buffers) == replaced and previous.allocations == 1


def test_a_rank_gives_up_its_commit_before_last_to_receive_into_only_when_it_receives(monkeypatch, request) -> None:
    from ringmaster.worker.sharding.shard_plan import NONE

    monkeypatch.setattr(dispatch_warmup, "context", lambda: SimpleNamespace(
        assignment=None, link=object(), tentative_given=False, backend="gloo", topology=lambda: (0, 1, 0, 1, 0, 1)))
    monkeypatch.setattr(dispatch_warmup, "group_size", lambda: 1)
    state = ShardedState(_builder(24), step=0)
    state._previous = _committed(24, request.getfixturevalue("real_mesh"), range(1))
    state._previous_commits = 3
    assert state._receive_spare(receiving=False) is None  # (a sender or a bystander keeps both commits)
    assert state._previous.skeleton and state._previous_commits == 3
    assert state._receive_spare(receiving=True) is state._previous
    assert state._previous.skeleton == {} and state._previous.allocations and state._previous_commits == NONE


def test_a_sender_that_stops_halfway_leaves_the_returning_member_its_last_commit_whole(request) -> None:
    """The commit before last is given up before a byte arrives; the last one is kept whole when
    the sender stops after the skeleton (a real Gloo pair of threads: the receive times out)."""
    from gloo_rings import on_ranks

    from ringmaster.torch.elastic.sharded_state import _move_shards
    from ringmaster.worker.sharding.shard_plan import Transfer
    from ringmaster.worker.train.collectives import Communicator

    mesh = request.getfixturevalue("real_mesh")
    sent = _committed(25, mesh, range(3))
    mine, previous = _committed(25, mesh, range(2)), _committed(25, mesh, range(1))
    own, own_digest = _pointers(mine.buffers), mine.data_digest()
    previous.forget()

    class StopsAfterTheSkeleton(Communicator):
        sent = 0

        def send(self, tensor: torch.Tensor, dst_rank: int) -> None:
            self.sent += 1
            if self.sent > 2:  # (the length, the skeleton: then it is gone)
                raise SystemExit("the sender stops here")
            super().send(tensor, dst_rank)

    def move(comm: Communicator) -> object:
        try:
            return _move_shards(sent if comm.rank == 0 else mine, comm, [Transfer(0, 0, (1,))],
                                spare=None if comm.rank == 0 else previous)
        except BaseException as exc:  # (what each rank ended with is the test's)
            return exc

    outcome = on_ranks(2, move, timeout_s=2, kind=lambda rank: StopsAfterTheSkeleton if rank == 0 else Communicator)
    assert isinstance(outcome[0], SystemExit) and isinstance(outcome[1], Exception), outcome
    assert _pointers(mine.buffers) == own and mine.data_digest() == own_digest and mine.skeleton
    assert previous.skeleton == {}  # (given up: no commit of it is claimed any more)
