"""Durable checkpoints of sharded state, in torch.distributed.checkpoint's (DCP) format.

A model sharded inside replica groups has no rank that holds it whole, so its checkpoint is
written by every rank, each its own shards, with DCP (`dcp.save`): the format PyTorch's own
FSDP2 and TorchTitan read, so a job's checkpoint loads into plain torchrun + FSDP2 and back,
and loads into a ring of another size or group size (DCP reshards on load). The tree is
`{<module name>: its model state dict, <optimizer name>: get_optimizer_state_dict's (parameters
by name), <scheduler name>: its state dict, <attribute>: its value, ..., "ringmaster":
{"commits": N}}` under `DIR/sharded-step-<N, 12 digits>/`.

Writing is collective: the ranks agree in a commit's own allreduce that one is due (rank 0
asks, by `--checkpoint-every`/`--checkpoint-interval`), then each writes its part into a
`.partial` folder; rank 0 renames it into place once DCP finished (its `.metadata`, written
last, makes it whole) and removes the oldest beyond `--checkpoint-keep`. A crash leaves either
a whole checkpoint or a `.partial` folder, never read.

Reading treats the folder as untrusted, as the other checkpoints are: DCP reads its metadata
with `pickle` and plain values with `torch.load(weights_only=False)`, either of which would run
code planted in the file; here the metadata is unpickled with only DCP's own metadata classes
allowed, and plain values with `weights_only=True` (`--checkpoint-trusted` lifts both).
"""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import re
import shutil
import time
from typing import Any, Callable, Mapping

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element  # (DCP's own, as its planner uses it)
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ringmaster.checkpoint.directory import UntrustedCheckpointError
from ringmaster.checkpoint.policy import CheckpointPolicy
from ringmaster.worker.train.errors import CheckpointMismatchError

PREFIX = "sharded-step-"
PARTIAL = ".partial"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d{{12}})$")
#: Where a checkpoint's tree keeps the state's own bookkeeping: the commit count and `ABOUT`.
RINGMASTER_ENTRY = "ringmaster"
#: The ring that wrote a checkpoint, kept beside its commit count (for the resume's report).
ABOUT = ("world_size", "group_size", "generation")
#: What DCP's metadata may hold: its own dataclasses, and the torch and pathlib values in them.
_ALLOWED_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"), ("collections", "OrderedDict")}


class _MetadataOnly(pickle.Unpickler):
    """Unpickles DCP's metadata and nothing else: a class outside it is refused by name."""

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name) if (module, name) in _ALLOWED or module in _ALLOWED_MODULES \
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)) else None
        if found is None:
            raise UntrustedCheckpointError(f"{module}.{name}")
        return found


class _CheckedReader(FileSystemReader):
    """DCP's file reader, its metadata unpickled by `_MetadataOnly` unless trusted."""

    def __init__(self, path: pathlib.Path, trusted: bool) -> None:
        super().__init__(str(path))
        self._trusted = trusted

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._trusted:
            return super().read_metadata(*args, **kwargs)
        path = pathlib.Path(str(self.path)) / ".metadata"
        try:
            metadata = _MetadataOnly(io.BytesIO(path.read_bytes())).load()
        except UntrustedCheckpointError as exc:
            raise UntrustedCheckpointError(
                f"{path} holds an object of {exc}, which DCP's metadata never does; loading it would run code from the "
                "file, so it is refused. If only this job can write that folder, pass --checkpoint-trusted") from None
        except Exception as exc:  # truncated, emptied, not a pickle: the file is not what DCP wrote
            raise CheckpointMismatchError(f"{path} cannot be read as DCP metadata ({type(exc).__name__}: "
                                          f"{str(exc)[:200]}); move that checkpoint away") from None
        if not isinstance(metadata, Metadata):
            raise CheckpointMismatchError(f"{path} is not DCP metadata (it holds a {type(metadata).__name__})")
        storage = metadata.storage_meta if metadata.storage_meta is not None else StorageMeta()
        storage.load_id = self.load_id
        metadata.storage_meta = storage
        return metadata


class _DataOnlyPlanner(DefaultLoadPlanner):
    """DCP's load planner, plain values loaded with `weights_only=True` unless trusted."""

    def __init__(self, trusted: bool) -> None:
        super().__init__()
        self._trusted = trusted

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        if self._trusted:
            return super().load_bytes(read_item, value)
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UntrustedCheckpointError(
                f"the checkpoint's {read_item.dest_index.fqn!r} holds objects other than tensors and plain containers "
                f"({str(exc).splitlines()[0][:200]}); loading it would run code from the file, so it is refused. Keep "
                "plain numbers, strings, lists and dicts in the state, or pass --checkpoint-trusted") from None
        set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        return None


def _tree(objects: Mapping[str, Any], plain: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's tree of the live objects (DTensors, parameters by name) and plain values."""
    modules = {n: v for n, v in objects.items() if isinstance(v, torch.nn.Module)}
    model = next(iter(modules.values())) if len(modules) == 1 else torch.nn.ModuleDict(modules)
    tree: dict[str, Any] = {}
    for name, value in objects.items():
        if isinstance(value, torch.nn.Module):
            tree[name] = get_model_state_dict(value)
        elif isinstance(value, torch.optim.Optimizer):
            tree[name] = get_optimizer_state_dict(model, value)
        else:
            tree[name] = value.state_dict()
    tree.update(plain)
    return tree


class ShardedCheckpoints:
    """A folder of DCP checkpoints of one job's sharded state (every call is collective)."""

    def __init__(self, path: pathlib.Path, policy: CheckpointPolicy, keep: int, trusted: bool) -> None:
        self.path = path
        self.policy = policy
        self.keep = keep
        self.trusted = trusted
        self.written: list[int] = []

    def due(self, commits: int) -> bool:
        return self.policy.due(commits, time.monotonic())

    def write(self, objects: Mapping[str, Any], plain: Mapping[str, Any], commits: int, rank: int,
              written_by: Mapping[str, int]) -> float:
        """Write commit `commits` (the live objects and `plain`, equal to it; `written_by`: the
        ring's `ABOUT` numbers). Returns the seconds it took; OSError and DCP's own errors
        propagate (on every rank: DCP gathers them)."""
        started = time.perf_counter()
        final = self.path / f"{PREFIX}{commits:012d}"
        partial = final.with_name(final.name + PARTIAL)
        if rank == 0:
            self.path.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)
        ours = {**{key: int(written_by.get(key, 0)) for key in ABOUT}, "commits": commits}
        dcp.save(_tree(objects, {**plain, RINGMASTER_ENTRY: ours}),
                 storage_writer=FileSystemWriter(str(partial), sync_files=True))
        if rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
            _fsync_dir(self.path)
            for old in self.checkpoints()[self.keep:]:
                shutil.rmtree(old, ignore_errors=True)
        self.policy.written(commits, time.monotonic())
        self.written.append(commits)
        return time.perf_counter() - started

    def checkpoints(self) -> list[pathlib.Path]:
        """The whole checkpoints here, newest first (a `.partial` folder or one without DCP's
        `.metadata` is not one)."""
        if not self.path.is_dir():
            return []
        found = [p for p in self.path.iterdir() if _NAME.match(p.name) and (p / ".metadata").is_file()]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def newest(self, report: Callable[[str], None]) -> pathlib.Path | None:
        """The newest whole checkpoint whose metadata reads (rank 0 asks, before the collective
        load): one truncated or emptied is reported and the one before it used, as for whole
        states; one holding planted code is refused (`UntrustedCheckpointError`), never skipped."""
        for path in self.checkpoints():
            try:
                _CheckedReader(path, self.trusted).read_metadata()
            except CheckpointMismatchError as exc:
                report(f"{exc}; trying the checkpoint before it")
                continue
            return path
        return None

    def load(self, path: pathlib.Path, objects: Mapping[str, Any], plain: Mapping[str, Any]) -> dict[str, Any]:
        """Load the checkpoint at `path` into the live objects (resharded onto their mesh);
        returns the plain values and `RINGMASTER_ENTRY` as the checkpoint holds them."""
        template = {**plain, RINGMASTER_ENTRY: dict.fromkeys(("commits", *ABOUT), 0)}
        tree = _tree(objects, template)
        reader = _CheckedReader(path, self.trusted)
        reader.read_metadata()  # (refused here by name: DCP would fold the refusal into errors of its own)
        try:
            dcp.load(tree, storage_reader=reader, planner=_DataOnlyPlanner(self.trusted))
        except (Exception, CheckpointException) as exc:
            cause = first_failure(exc)
            if isinstance(cause, UntrustedCheckpointError):
                raise cause from None
            raise CheckpointMismatchError(
                f"the checkpoint {path} does not fit this model and state: {type(cause).__name__}: "
                f"{str(cause).strip()[:600]}. Point --checkpoint-dir at this model's checkpoints, or move that "
                "folder away to start afresh") from None
        modules = {n: v for n, v in objects.items() if isinstance(v, torch.nn.Module)}
        model = next(iter(modules.values())) if len(modules) == 1 else torch.nn.ModuleDict(modules)
        for name, value in objects.items():
            if isinstance(value, torch.nn.Module):
                set_model_state_dict(value, tree[name])
            elif isinstance(value, torch.optim.Optimizer):
                set_optimizer_state_dict(model, value, tree[name])
            else:
                value.load_state_dict(tree[name])
        commits = tree[RINGMASTER_ENTRY].get("commits") if isinstance(tree[RINGMASTER_ENTRY], dict) else None
        if not isinstance(commits, int) or isinstance(commits, bool) or commits < 0:
            raise CheckpointMismatchError(f"the checkpoint {path} holds no commit count ({RINGMASTER_ENTRY!r}: "
                                          f"{tree[RINGMASTER_ENTRY]!r}); it was not written by a ShardedState")
        self.policy.start(commits, time.monotonic())
        return {name: tree[name] for name in template}


def first_failure(exc: BaseException) -> BaseException:
    """The error itself: DCP wraps each rank's in a `CheckpointException` (a BaseException)."""
    if isinstance(exc, CheckpointException):
        for failure in exc.failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, BaseException):
                return inner
    return exc


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
