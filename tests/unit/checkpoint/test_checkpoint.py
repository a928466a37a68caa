"""The checkpoint package on its own: tree splitting, host snapshots, the checkpoint folder,
the write policy and the background writer. Real files in a temporary folder; the only
faults are real ones (a path that cannot be a folder, bytes changed on disk)."""

from __future__ import annotations

import json
import os
import pathlib
import threading
from collections import OrderedDict

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ringmaster.checkpoint.directory import CheckpointDirectory
from ringmaster.checkpoint.manifest import (
    MANIFEST_NAME,
    STATE_NAME,
    CheckpointError,
    CheckpointFolderError,
    UntrustedCheckpointError,
)
from ringmaster.checkpoint.memory import HostSnapshot
from ringmaster.checkpoint.policy import CheckpointPolicy
from ringmaster.checkpoint.tree import TensorRef, flatten, has_plain_leaves, skeleton_digest, unflatten
from ringmaster.checkpoint.writer import BackgroundWriter
from ringmaster.settings import DEFAULT_CHECKPOINT_INTERVAL_S
from ringmaster.worker.train.checkpointing import Checkpointing

# ---------------------------------------------------------------- tree

leaves = st.one_of(st.integers(), st.text(max_size=5), st.none(),
                   st.lists(st.integers(0, 4), min_size=0, max_size=3).map(lambda s: torch.arange(float(len(s) + 1))))
trees = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3),
    st.lists(inner, max_size=3).map(tuple)), max_leaves=12)


def same_tree(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same_tree(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b))
    return a == b


@given(trees)
def test_flatten_then_unflatten_gives_the_tree_back(tree) -> None:
    skeleton, tensors = flatten(tree)
    assert same_tree(unflatten(skeleton, tensors), tree)
    assert all(isinstance(r, TensorRef) for r in [skeleton] if isinstance(skeleton, TensorRef))


def test_skeleton_keeps_ordered_dicts_and_numbers_tensors_from_start() -> None:
    skeleton, tensors = flatten(OrderedDict(a=torch.ones(2), b=[1, torch.zeros(3)]), start=5)
    assert isinstance(skeleton, OrderedDict)
    assert skeleton["a"] == TensorRef(5, (2,), torch.float32) and skeleton["b"][1].index == 6
    assert len(tensors) == 2
    assert has_plain_leaves(skeleton) and not has_plain_leaves(OrderedDict(a=skeleton["a"]))


def test_skeleton_digest_follows_objects_and_layout_not_values() -> None:
    a, _ = flatten({"w": torch.zeros(3), "epoch": 1})
    b, _ = flatten({"w": torch.ones(3), "epoch": 1})
    c, _ = flatten({"w": torch.ones(4), "epoch": 1})
    d, _ = flatten({"w": torch.ones(3), "epoch": 2})
    assert skeleton_digest(a) == skeleton_digest(b)
    assert len({skeleton_digest(a), skeleton_digest(c), skeleton_digest(d)}) == 3


# ---------------------------------------------------------------- snapshot

def model_and_optimizer() -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_commits_reuse_their_buffers_and_copy_back_in_place() -> None:
    model, optimizer = model_and_optimizer()
    snapshot = HostSnapshot()
    for _ in range(5):
        snapshot.capture({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 2})
    assert snapshot.allocations == 1
    assert len(snapshot.buffers) == 2  # float32 and int64 (BatchNorm's counter): one flat buffer each
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[0].weight
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert snapshot.copy_into("model", model.state_dict())
    assert model[0].weight is weight  # same tensor, committed values
    for name, value in model.state_dict().items():
        assert torch.equal(value, committed[name]), name


def test_snapshot_is_not_changed_by_training_on_nor_aliased_by_materialize() -> None:
    model, optimizer = model_and_optimizer()
    snapshot = HostSnapshot()
    snapshot.capture({"optimizer": optimizer.state_dict(), "notes": {"lr": [0.1]}})
    exp_avg = snapshot.materialize("optimizer")["state"][0]["exp_avg"].clone()
    model(torch.randn(5, 8)).sum().backward()
    optimizer.step()
    assert torch.equal(snapshot.materialize("optimizer")["state"][0]["exp_avg"], exp_avg)
    copy = snapshot.materialize("optimizer")
    copy["state"][0]["exp_avg"].add_(5)
    notes = snapshot.materialize("notes")
    notes["lr"].append(9)
    assert torch.equal(snapshot.materialize("optimizer")["state"][0]["exp_avg"], exp_avg)
    assert snapshot.materialize("notes") == {"lr": [0.1]}


def test_a_new_layout_allocates_and_copy_into_refuses_a_mismatch() -> None:
    snapshot = HostSnapshot()
    snapshot.capture({"w": torch.ones(3)})
    assert not snapshot.copy_into("w", torch.ones(4))
    snapshot.capture({"w": torch.ones(4)})
    assert snapshot.allocations == 2


def test_data_digest_sees_a_changed_byte() -> None:
    snapshot = HostSnapshot()
    values = torch.arange(1000.0)
    snapshot.capture({"w": values, "b": torch.ones(3, dtype=torch.bool)})
    before = snapshot.data_digest()
    snapshot.capture({"w": values, "b": torch.ones(3, dtype=torch.bool)})
    assert snapshot.data_digest() == before
    values[17] += 1
    snapshot.capture({"w": values, "b": torch.ones(3, dtype=torch.bool)})
    assert snapshot.data_digest() != before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks that a commit allocates nothing on the "
                                                          "GPU")
def test_commit_of_cuda_state_goes_to_pinned_host_memory_only() -> None:
    model = torch.nn.Linear(1024, 1024).cuda()
    snapshot = HostSnapshot()
    snapshot.capture({"model": model.state_dict()})
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(3):
        snapshot.capture({"model": model.state_dict()})
    assert torch.cuda.memory_allocated() == before
    assert snapshot.pinned and all(b.device.type == "cpu" and b.is_pinned() for b in snapshot.buffers)
    with torch.no_grad():
        model.weight.zero_()
    assert snapshot.copy_into("model", model.state_dict())
    assert torch.equal(model.weight.cpu(), snapshot.tensors[0])


# ---------------------------------------------------------------- folder

def write_some(directory: CheckpointDirectory, steps) -> None:
    for step in steps:
        directory.write({"model": {"w": torch.full((64,), float(step))}, "step": step}, step, 2, 1, 0.0)


def test_written_checkpoint_loads_with_plain_torch_and_verifies(tmp_path) -> None:
    directory = CheckpointDirectory(tmp_path)
    write_some(directory, [7])
    folder = tmp_path / "step-000000000007"
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST_NAME, STATE_NAME]
    loaded = torch.load(folder / STATE_NAME, weights_only=True)
    assert loaded["step"] == 7 and torch.equal(loaded["model"]["w"], torch.full((64,), 7.0))
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    assert manifest["step"] == 7 and manifest["world_size"] == 2 and manifest["files"][STATE_NAME]["bytes"] > 0
    assert directory.verify(folder).step == 7
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_only_the_newest_k_are_kept(tmp_path) -> None:
    directory = CheckpointDirectory(tmp_path, keep=2)
    write_some(directory, [1, 2, 3, 4])
    assert [p.name for p in directory.checkpoints()] == ["step-000000000004", "step-000000000003"]


@pytest.mark.parametrize("damage, reason", [
    ("truncate", "truncated"), ("flip", "corrupted"), ("no-manifest", "never finished"),
    ("newer-version", "format version 99"), ("garbage-manifest", "unreadable"), ("missing-file", "missing"),
])
def test_a_damaged_newest_checkpoint_is_reported_and_the_one_before_used(tmp_path, damage, reason) -> None:
    directory = CheckpointDirectory(tmp_path)
    write_some(directory, [3, 5])
    newest = tmp_path / "step-000000000005"
    state, manifest = newest / STATE_NAME, newest / MANIFEST_NAME
    if damage == "truncate":
        os.truncate(state, state.stat().st_size - 10)
    elif damage == "flip":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0x01
        state.write_bytes(bytes(data))
    elif damage == "no-manifest":
        manifest.unlink()
    elif damage == "newer-version":
        manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), version=99)))
    elif damage == "garbage-manifest":
        manifest.write_text("{not json")
    else:
        state.unlink()
    with pytest.raises(CheckpointError, match=reason):
        directory.verify(newest)
    reports: list[str] = []
    found = directory.load_newest(reports.append)
    assert found is not None
    assert found[0].step == 3 and found[1]["step"] == 3
    assert len(reports) == 1 and str(newest) in reports[0] and reason in reports[0]
    # moved aside, so it no longer counts among the `keep` newest (an older good one stays)
    assert "moved aside to .refused-step-000000000005-" in reports[0]
    assert [p.name for p in directory.checkpoints()] == ["step-000000000003"]
    assert [p.name.rsplit("-", 1)[0] for p in tmp_path.glob(".refused-*")] == [".refused-step-000000000005"]


def test_checkpoints_are_the_users_alone_whatever_the_umask(tmp_path) -> None:
    old = os.umask(0o002)
    try:
        folder = CheckpointDirectory(tmp_path / "ckpt").write({"w": torch.ones(2)}, 1, 1, 1, 0.0)
    finally:
        os.umask(old)
    assert (tmp_path / "ckpt").stat().st_mode & 0o777 == 0o700 and folder.stat().st_mode & 0o777 == 0o700
    assert {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()} == {STATE_NAME: 0o600, MANIFEST_NAME: 0o600}


@pytest.mark.parametrize("where", ["under-a-file", "under-proc", "read-only"])
def test_a_folder_that_cannot_be_written_is_refused_naming_it(tmp_path, where) -> None:
    if where == "under-a-file":
        (tmp_path / "plain").write_text("")
        path = tmp_path / "plain" / "ckpt"
    elif where == "under-proc":
        path = pathlib.Path("/proc/ringmaster-ckpt")
    else:
        path = tmp_path / "ro"
        path.mkdir(mode=0o500)
        if os.access(path, os.W_OK):  # (root writes anywhere: a read-only folder needs a mount, tested e2e)
            pytest.skip("this user writes into a folder without write permission")
    with pytest.raises(CheckpointFolderError, match=f"the checkpoint folder {path} cannot be written on host"):
        CheckpointDirectory(path).check_writable()


def test_no_checkpoint_at_all(tmp_path) -> None:
    assert CheckpointDirectory(tmp_path / "absent").load_newest(print) is None


def test_unfinished_temporary_folders_are_removed(tmp_path) -> None:
    (tmp_path / ".tmp-step-000000000009-123").mkdir()
    directory = CheckpointDirectory(tmp_path)
    directory.remove_unfinished()
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_the_checkpoints_there_untouched(tmp_path) -> None:
    directory = CheckpointDirectory(tmp_path)
    write_some(directory, [1])
    before = directory.verify(tmp_path / "step-000000000001")

    class Unpicklable:
        def __reduce__(self):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        directory.write({"x": Unpicklable()}, 2, 1, 1, 0.0)
    assert [p.name for p in tmp_path.iterdir()] == ["step-000000000001"]
    assert directory.verify(tmp_path / "step-000000000001") == before


# ---------------------------------------------------------------- policy

def test_policy_every_n_commits() -> None:
    policy = CheckpointPolicy(every=3)
    due = []
    for step in range(1, 10):
        if policy.due(step, 0.0):
            policy.written(step, 0.0)
            due.append(step)
    assert due == [3, 6, 9]


def test_policy_every_t_seconds_and_not_for_an_older_step() -> None:
    policy = CheckpointPolicy(interval_s=10)
    policy.start(0, 100.0)
    assert not policy.due(1, 105.0)
    assert policy.due(2, 110.0)
    policy.written(2, 110.0)
    assert not policy.due(2, 500.0)  # rolled back to the step already written
    assert CheckpointPolicy().interval_s == DEFAULT_CHECKPOINT_INTERVAL_S
    with pytest.raises(ValueError, match="--checkpoint-every"):
        CheckpointPolicy(every=0)


# ---------------------------------------------------------------- writer

def test_writer_skips_while_busy_and_reports_a_disk_that_refuses(tmp_path) -> None:
    reports: list[str] = []
    snapshot = HostSnapshot()
    snapshot.capture({"w": torch.ones(1 << 20), "step": 1})
    writer = BackgroundWriter(CheckpointDirectory(tmp_path / "ok"), reports.append)
    assert writer.submit(snapshot, 1, 1, 1)
    accepted_while_busy = writer.submit(snapshot, 2, 1, 1)
    assert writer.flush(60)
    assert writer.written == ([1, 2] if accepted_while_busy else [1])
    assert len(reports) == 1 and "checkpoint of step 1 written" in reports[0]

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    failing = BackgroundWriter(CheckpointDirectory(blocker / "ckpt"), reports.append)
    for step in (1, 2):
        assert failing.submit(snapshot, step, 1, 1)
        assert failing.flush(60)
    assert failing.failures == 2 and failing.written == []
    failure_reports = [r for r in reports if "could not write" in r]
    assert len(failure_reports) == 1  # once per cause
    assert "Not a directory" in failure_reports[0] and "no checkpoint was written yet" in failure_reports[0]


def test_writer_does_not_block_the_caller_for_the_write(tmp_path) -> None:
    """The caller returns once the commit is staged; the disk work happens on the writer thread."""
    snapshot = HostSnapshot()
    snapshot.capture({"w": torch.ones(1 << 22)})
    release = threading.Event()
    directory = CheckpointDirectory(tmp_path)
    original = directory.write

    def slow_write(*args, **kwargs) -> pathlib.Path:
        release.wait(30)
        return original(*args, **kwargs)

    directory.write = slow_write  # type: ignore[method-assign]  # holds the disk write until released
    writer = BackgroundWriter(directory, lambda _: None)
    assert writer.submit(snapshot, 1, 1, 1)
    assert writer.busy and not writer.submit(snapshot, 2, 1, 1)
    release.set()
    assert writer.flush(60) and writer.written == [1]


class _RunsCode:
    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_is_loaded_as_data_and_a_planted_one_runs_nothing(tmp_path) -> None:
    directory = CheckpointDirectory(tmp_path / "ckpt")
    write_some(directory, [3])
    marker = tmp_path / "ran"
    directory.write({"model": {"w": torch.zeros(2)}, "evil": _RunsCode(marker)}, 4, 2, 1, 0.0)
    with pytest.raises(UntrustedCheckpointError, match=r"holds an object of posix\.system.*--checkpoint-trusted"):
        directory.load_newest(lambda line: None)
    assert not marker.exists()  # and the older one was not silently used instead


def test_a_trusted_folder_loads_objects_of_any_class(tmp_path) -> None:
    directory = CheckpointDirectory(tmp_path)
    directory.write({"model": {"w": torch.ones(2)}, "rng": np.arange(3)}, 5, 1, 1, 0.0)
    with pytest.raises(UntrustedCheckpointError, match="numpy"):
        directory.load_newest(lambda line: None)
    found = directory.load_newest(lambda line: None, trusted=True)
    assert found is not None and found[0].step == 5 and list(found[1]["rng"]) == [0, 1, 2]


def test_trust_comes_from_the_job_environment(tmp_path) -> None:
    env = {"RINGMASTER_CHECKPOINT_DIR": str(tmp_path)}
    assert not Checkpointing.from_environ(print, env).trusted
    assert Checkpointing.from_environ(print, {**env, "RINGMASTER_CHECKPOINT_TRUSTED": "1"}).trusted


def test_a_write_that_succeeded_is_not_reported_as_a_failure(tmp_path) -> None:
    failures: list[str] = []
    written: list[str] = []
    snapshot = HostSnapshot()
    snapshot.capture({"w": torch.ones(4), "step": 1})
    writer = BackgroundWriter(CheckpointDirectory(tmp_path / "ok"), failures.append, written.append)
    assert writer.submit(snapshot, 1, 1, 1) and writer.flush(60)
    assert failures == [] and len(written) == 1 and "checkpoint of step 1 written" in written[0]
