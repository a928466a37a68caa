"""`hvd.elastic.ShardedState`: elastic state of a model sharded inside replica groups (FSDP2).

A job in replica groups (`--group-size K`) shards its model inside each group with PyTorch's
own `fully_shard` on `hvd.elastic.mesh()`. A module sharded on one generation's mesh cannot
move to the next one's, so the state holds a `build(mesh)` function instead of the objects:
in every generation it builds them on the new mesh and loads the committed shards into them,
and the training function takes them from the state (`state.model`, `state.optimizer`).

Each worker commits only its own shards (the local tensors of the DTensors of the module's and
the optimizer's state dicts) in host memory, with the script's plain attributes. It keeps its
last two commits, so that after a failure the ring can always go on from one commit that every
shard index holds (`shard_plan`: no rank is more than one commit ahead of another). After each
reset, every rank says which shard index its commits belong to and which counts it holds; the
ring takes the newest commit held at every index; a rank that holds it only as its previous
commit goes back to that one, and each rank now at a shard index that does not hold the commit
there (a new group, a lost member's partner placed at another index) gets it from the lowest
rank that does, point to point (no disk). Survivors of a failure hold it already and nothing
moves. The replica guard compares the shards among the ranks of each shard index and the plain
attributes across the ring.

With `--checkpoint-dir`, durable checkpoints are written in DCP's format by every rank, each its
own shards (`sharded_checkpoint`), at the commits the ranks agree on in the commit's own
allreduce; a job in which no rank holds a commit (its first start, a restart after every
worker died) loads the newest, resharded onto its mesh, whatever group size wrote it.
"""

from __future__ import annotations

import importlib
import io
import pathlib
import time
from typing import Any, Callable, Mapping, Sequence

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves

from ringmaster.checkpoint.digest import tree_digest
from ringmaster.checkpoint.memory import HostSnapshot, entries_layout
from ringmaster.checkpoint.tree import unflatten
from ringmaster.torch.basics import context
from ringmaster.torch.collectives import broadcast_object
from ringmaster.torch.elastic import dispatch_warmup
from ringmaster.torch.elastic.generation_mesh import freeze_heap, mesh
from ringmaster.torch.elastic.groups import replica_group
from ringmaster.torch.elastic.handlers import SCHEDULERS, SamplerHandler, sharded_handler_for
from ringmaster.torch.elastic.sampler import ElasticSampler
from ringmaster.torch.elastic.state import ObjectState
from ringmaster.worker.sharding import fsdp_comms, kept_memory, newcomer_memory, no_init
from ringmaster.worker.sharding.newcomer_memory import NewcomerMemory
from ringmaster.worker.sharding.shard_plan import (
    NONE,
    Holding,
    SyncProof,
    Transfer,
    consistent_commit,
    equal_by_sync,
    transfers,
)
from ringmaster.worker.sharding.sharded_checkpoint import RINGMASTER_ENTRY, ShardedCheckpoints, first_failure
from ringmaster.worker.train.collectives import Communicator
from ringmaster.worker.train.errors import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ReplicasDivergedError,
)
from ringmaster.worker.train.replica_guard import compare_live_state_in_groups
from ringmaster.worker.train.say import Kind, say
from ringmaster.worker.train.state_sync import SyncPlan, fingerprint

#: Imported while the worker warms up rather than in its first build on a generation's mesh:
#: the first optimizer a build makes imports torch._dynamo (torch.optim's constructors are
#: wrapped by it), 0.6 s of CPU that a newcomer group would spend while the survivors wait.
WARM_IMPORTS = ("torch._dynamo",)
#: How long a durable checkpoint that failed (not on the disk) waits for the rendezvous' word that
#: the generation is over, which makes it a peer's failure (as `elastic.MESH_FAILURE_WAIT_S`).
PEER_FAILURE_WAIT_S = 10.0
#: The largest pickled skeleton (objects and tensor layout) one rank takes from another.
MAX_SKELETON_BYTES = 64 << 20


def _built_empty(build: Callable[[Any], Mapping[str, Any]], generation_mesh: Any,
                 kept: Mapping[str, Any] | None = None) -> tuple[Mapping[str, Any], int] | None:
    """`build(mesh)` run on the meta device, then its modules given memory on the mesh's device,
    uninitialized (`to_empty`, swapping each parameter's data in place, so that the optimizer
    build() made holds them still): what TorchTitan does before it loads a checkpoint. A commit
    is loaded into everything it made, so nothing is computed, allocated whole (FSDP2 shards a
    module built on the meta device as metadata) nor copied into shards: 0.05 s against 0.74 s
    for bench/sharded.py's model built the usual way. None when build() does not run on the meta
    device or makes something this cannot give memory (a non-persistent buffer, a tensor kept
    outside its modules' parameters and buffers, an optimizer's state made at once): then it is
    built without initializing (`no_init`), as before.

    `kept` (a module's name: its last generation's local tensors by name, `kept_memory`) gives a
    survivor's modules their old memory instead of fresh memory where it fits. Returns what was
    built and how many tensors got fresh memory."""
    try:
        with torch.device("meta"):
            built = build(generation_mesh)
    except Exception:  # (data-dependent code, an op meta tensors lack: built the usual way, which says what)
        return None
    if not _objects_only(built):
        return None
    modules = [v for v in built.values() if isinstance(v, torch.nn.Module)]
    if any(m._non_persistent_buffers_set for module in modules for m in module.modules()):
        return None  # (not in the state dict: no commit restores it)
    device = torch.device(generation_mesh.device_type)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    fresh = sum(kept_memory.give_memory(value, device, (kept or {}).get(name, {}))
                for name, value in built.items() if isinstance(value, torch.nn.Module))
    tensors: list[Any] = []
    for value in built.values():
        if isinstance(value, torch.nn.Module):
            tensors += [t for m in value.modules() for t in _tensors_in(vars(m))]  # (its parameters and buffers too)
        elif isinstance(value, torch.optim.Optimizer):
            tensors += [p for group in value.param_groups for p in group["params"]]
            tensors += [t for entries in value.state.values() for t in entries.values() if isinstance(t, torch.Tensor)]
    if any((t.to_local() if isinstance(t, DTensor) else t).is_meta for t in tensors):
        return None
    return built, fresh


def _objects_only(built: Any) -> bool:
    """Whether build() returned named objects ShardedState takes (modules, optimizers, schedulers)."""
    return isinstance(built, Mapping) and all(isinstance(v, (torch.nn.Module, torch.optim.Optimizer, *SCHEDULERS))
                                              for v in built.values())


def _tensors_in(tree: Any) -> list[Any]:
    """The tensors in `tree` and in the lists, tuples and dicts it holds (torch's pytree leaves)."""
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


class ShardedState(ObjectState):
    """State of a job whose model is sharded inside replica groups:
    `ShardedState(build, step=0)`, where `build(mesh)` returns `{"model": ..., "optimizer": ...}`
    (modules sharded with `fully_shard(..., mesh=mesh)`, their optimizers, schedulers) and the
    other keywords are plain attributes, as in `ObjectState`, but for `ElasticSampler`s, which
    are kept across generations and re-dealt at every reset, as in `TorchState`."""

    def __init__(self, build: Callable[[Any], Mapping[str, Any]], **kwargs: Any) -> None:
        if not callable(build):
            raise TypeError(f"ShardedState(build, ...) takes a function build(mesh) first, got {type(build).__name__}")
        self._build = build
        self._handlers: dict[str, Any] = {}
        self._built_generation: int | None = None
        self._previous = HostSnapshot()  # the commit before the last
        self._previous_commits = NONE
        self._committed_index = 0  # the shard index (rank in its group) the commits were made at
        #: Bytes this worker received at its last sync: its commit healed from a peer (0: none).
        self.healed_bytes = 0
        self._proven_by_sync = False  # the last sync proved every rank's live state equal (no guard due)
        #: A newcomer built its objects blind (no values) for a commit a peer sends: until one
        #: arrives it holds no commit, not a "commit 0" of whatever its memory held.
        self._holds_nothing = False
        #: The last generation's objects' local tensors (`kept_memory`), until the next build takes them.
        self._kept_memory: dict[str, Any] = {}
        self._values_kept = False  # this generation's modules were given the kept memory, every tensor of it
        self._live_is_commit = False  # the live values are this worker's newest commit (it left at a commit)
        # Samplers are kept across generations (nothing of them is sharded): committed, restored,
        # re-dealt at every reset, written in durable checkpoints, as in TorchState.
        self._kept = {name: SamplerHandler(value) for name, value in kwargs.items()
                      if isinstance(value, ElasticSampler)}
        for name, handler in self._kept.items():
            del kwargs[name]
            object.__setattr__(self, name, handler.value)
        super().__init__(**kwargs)
        settings, self._durable = self._durable, None  # (rank 0's writer of whole states does not apply)
        self._dcp = None if settings is None else ShardedCheckpoints(
            settings.directory.path, settings.policy, settings.directory.keep, settings.trusted)
        self._dcp_failing = ""  # why the last durable checkpoint failed; "" after one was written
        for module in WARM_IMPORTS:
            importlib.import_module(module)
        #: A newcomer's memory for its likely place, faulted in while it waits (`newcomer_memory`).
        self._reserved: NewcomerMemory | None = None
        # (a newcomer, before it asks for its place: see dispatch_warmup and newcomer_memory)
        dispatch_warmup.warm(build, then=self._reserve_memory)
        freeze_heap()  # (now, while this worker warms up, not in a reset: see generation_mesh)

    def _reserve_memory(self, built: Mapping[str, Any]) -> None:
        """`build(mesh)`'s objects, made on the meta device on the mesh this newcomer is likely to
        join (`dispatch_warmup`): the memory they and its commits will take, faulted in now
        (`newcomer_memory`). Something build() made that is no object ShardedState takes is left
        for the sync to refuse, saying what it was."""
        if not _objects_only(built):
            return
        handlers = {name: sharded_handler_for(name, value) for name, value in built.items()}
        reserved = newcomer_memory.reserve({name: handler.memory() for name, handler in handlers.items()},
                                           entries_layout(self._entries_of(handlers)))
        self._kept_memory = reserved.kept
        self._previous.reserve(reserved.staging.layout)  # (its first own commit goes there)
        self._reserved = reserved

    # ------------------------------------------------------------ the generation's objects
    def _ensure_built(self, commit_coming: bool = False) -> bool:
        """Build the objects on this generation's mesh (collective: every rank calls it in the
        same generation). True when they were (re)built, so the commit must be loaded into them.

        A worker that holds a commit of them loads one into every object built (its own, or one
        a peer sends), so it builds them without `torch.nn.init`'s work (`no_init`): a tenth of
        a second and more of a survivor's recovery for a model of 20 M parameters. So does a
        newcomer to a ring where some rank holds a commit (`commit_coming`: one is sent to it).
        Should the build make an object its commits do not hold, it is built again the usual
        way (a newcomer's, once it received its commit: `_rebuild_uncommitted`)."""
        ctx = context()
        generation = ctx.assignment.generation if ctx.assignment is not None else 0
        if self._built_generation == generation and self._handlers:
            return False
        self._drop_objects()
        generation_mesh = mesh()
        self._values_kept = False
        if self._commits > 0 or commit_coming:
            kept = {name: memory for name, memory in self._kept_memory.items() if isinstance(memory, dict)}
            made = _built_empty(self._build, generation_mesh, kept)
            if made is not None:
                built, fresh = made
                self._values_kept = fresh == 0 and bool(kept)
            else:  # (something it makes cannot be given memory afterwards)
                with no_init.skipped():
                    built = self._build(generation_mesh)
            if self._commits > 0 and isinstance(built, Mapping) and not set(built) <= set(self._snapshot.skeleton):
                del built  # (an object no commit of this worker holds: its initial values count)
                built = self._build(generation_mesh)
        else:
            built = self._build(generation_mesh)
        self._adopt(built, generation)
        return True

    def _adopt(self, built: object, generation: int) -> None:
        """Make what `build(mesh)` returned this state's objects of `generation`."""
        if not isinstance(built, Mapping):
            raise TypeError(f"build(mesh) must return a dict of named objects ({{'model': ..., 'optimizer': ...}}), "
                            f"got {type(built).__name__}")
        handlers = {}
        for name, value in built.items():
            if not isinstance(name, str) or not name.isidentifier() or name in self._object_names or name in self._kept:
                raise ValueError(f"build(mesh) returned the name {name!r}: give each object a name of its own, "
                                 "a Python identifier not used by ShardedState's other attributes")
            handlers[name] = sharded_handler_for(name, value)
        self._handlers = handlers
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        self._built_generation = generation
        link = context().link
        if link is not None:  # (FSDP2's collectives give up at the generation's end: `fsdp_comms`)
            fsdp_comms.guard(dict(built), lambda: link.generation_over(generation))

    def _rebuild_uncommitted(self) -> None:
        """A newcomer built its objects without initializing them for the commit a peer sent;
        should that commit lack one of them, they are built again the usual way, so that what
        no commit overwrites starts from its initial values."""
        if set(self._handlers) <= set(self._snapshot.skeleton):
            return
        generation = self._built_generation
        self._drop_objects()
        self._adopt(self._build(mesh()), 0 if generation is None else generation)

    def _drop_objects(self) -> None:
        """Forget the objects built on an old mesh, so that releasing it can free its groups;
        their local tensors are kept (`kept_memory`) as the next build's memory."""
        if self._handlers:
            self._kept_memory = {name: handler.memory() for name, handler in self._handlers.items()}
        for name in self._handlers:
            object.__setattr__(self, name, None)
        self._handlers = {}
        self._built_generation = None

    # ------------------------------------------------------------ what a commit holds
    def _entries(self) -> dict[str, Any]:
        return self._entries_of(self._handlers)

    def _entries_of(self, handlers: Mapping[str, Any]) -> dict[str, Any]:
        """What a commit holds: the plain attributes, the samplers, then the objects of `handlers`."""
        entries = super()._entries()
        entries.update({name: handler.state_dict() for name, handler in self._kept.items()})
        entries.update({name: handler.state_dict() for name, handler in handlers.items()})
        return entries

    def _load_entries(self, snapshot: HostSnapshot, held: bool = False) -> None:
        """Load `snapshot` into the live objects; `held`: the objects' memory is this worker's
        last generation's, which holds the snapshot's values already (nothing is copied)."""
        for name, handler in self._kept.items():
            if name in snapshot.skeleton:
                handler.load(snapshot, name)
        for name, handler in self._handlers.items():
            if name in snapshot.skeleton:
                handler.load(snapshot, name, held=held, kept=self._kept_memory.get(name))
        super()._load_entries(snapshot)

    def save(self) -> None:
        super().save()
        self._live_is_commit = True

    def reset(self) -> None:
        """Re-deal the samplers to the current ring."""
        for handler in self._kept.values():
            handler.on_reset()

    def commit(self) -> None:
        """Commit into the older of the two snapshots, so the one before stays held."""
        self._previous_commits = self._commits
        self._snapshot, self._previous = self._previous, self._snapshot
        self._committed_index = replica_group().rank
        self._holds_nothing = False
        try:
            super().commit()
        except HostsUpdatedInterrupt:
            raise  # (the live values are this commit: the next build can keep them)
        self._live_is_commit = False  # (training goes on from it)

    def restore(self) -> None:
        """Go back to the last commit: the plain attributes now; the sharded objects are built
        again on the next generation's mesh, and the commit loaded into them there."""
        self._drop_objects()
        self._live_is_commit = False
        super().restore()

    def leave_generation(self) -> None:
        self._drop_objects()

    # ------------------------------------------------------------ durable checkpoints (DCP)
    def _objects(self) -> dict[str, Any]:
        return {name: handler.value for name, handler in {**self._handlers, **self._kept}.items()}

    def _plain(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._object_names}

    def _durable_vote(self) -> bool:
        return self._dcp is not None and context().topology()[0] == 0 and self._dcp.due(self._commits)

    def _durable_agreed(self, due: bool) -> None:
        if due:
            self._write_durable()

    def _make_durable(self, ctx) -> None:
        """A drain leaves too few workers: this commit is written now, whatever the policy."""
        if self._dcp is not None:
            self._write_durable()

    def finish(self) -> str:
        """Training returned (on every rank at the same commit): write the last commit unless it is."""
        if self._dcp is None or self._commits == 0 or (self._dcp.written and self._dcp.written[-1] >= self._commits):
            return ""
        return self._write_durable()

    def _write_durable(self) -> str:
        """Every rank writes its shards of this commit (collective). A failure of the disk is
        reported and training goes on with in-memory commits; a peer's failure in DCP's own
        collectives is the generation's (HorovodInternalError). Returns the failure, or ""."""
        assert self._dcp is not None
        if self._dcp.written and self._dcp.written[-1] == self._commits:
            return ""  # (a drain's and the policy's checkpoint at the same commit: written once)
        ctx = context()
        rank, size = ctx.topology()[:2]
        generation = ctx.assignment.generation if ctx.assignment is not None else 0
        written_by = {"world_size": size, "group_size": replica_group().size, "generation": generation}
        try:
            seconds = self._dcp.write(self._objects(), self._plain(), self._commits, rank, written_by)
        except (Exception, CheckpointException) as exc:
            cause = first_failure(exc)
            if not isinstance(cause, OSError) and ctx.link is not None \
                    and ctx.link.wait_generation_over(generation, PEER_FAILURE_WAIT_S):
                raise HorovodInternalError(f"a durable checkpoint's collective failed: {cause}") from None
            failure = (f"the sharded checkpoint of commit {self._commits} was not written to {self._dcp.path} "
                       f"({type(cause).__name__}: {str(cause).strip()[:300]}); training goes on with in-memory commits")
            if rank == 0 and failure != self._dcp_failing:
                say(Kind.CHECKPOINT_WRITE_FAILED, error=failure)
            self._dcp_failing = failure
            return failure
        if rank == 0 and (len(self._dcp.written) == 1 or self._dcp_failing):
            say(Kind.CHECKPOINT_WRITTEN, detail=f"wrote the sharded checkpoint of commit {self._commits} to "
                                               f"{self._dcp.path} in {seconds:.2f} s (DCP: every rank its shards)")
        self._dcp_failing = ""
        return ""

    def _resume_from_checkpoint(self) -> bool:
        """No rank holds a commit (the job's first start, or a restart after every worker died):
        load the newest whole checkpoint into every rank's objects, resharded onto this mesh."""
        assert self._dcp is not None
        ctx = context()
        newest = self._dcp.newest(lambda message: say(Kind.CHECKPOINT_SKIPPED, reason=message)) \
            if ctx.topology()[0] == 0 else None
        chosen = broadcast_object(str(newest) if newest is not None else None, 0)
        if chosen is None:
            return False
        values = self._dcp.load(pathlib.Path(chosen), self._objects(), self._plain())
        ours = values.pop(RINGMASTER_ENTRY)
        for name, value in values.items():
            setattr(self, name, value)
        self._commits = ours["commits"]
        self._snapshot.capture(self._entries())
        self._holds_nothing = False
        self._committed_index, self._previous_commits = replica_group().rank, NONE
        if ctx.topology()[0] == 0:
            say(Kind.CHECKPOINT_RESUMED, step=self._commits, directory=str(self._dcp.path),
                world_size=ours.get("world_size", "?"), written_in=ours.get("generation", "?"))
        return True

    # ------------------------------------------------------------ after a reset
    def _sync_committed(self, after_reset: bool) -> SyncPlan:
        started = time.perf_counter()
        ctx = context()
        comm = ctx.communicator()
        group = replica_group()
        if self._commits == 0:
            self._committed_index = group.rank  # (its "commit 0", once built, is at its own index)
        held = self._commits

        def gather() -> list[torch.Tensor]:
            latest = NONE if self._holds_nothing else self._commits
            return comm.allgather(torch.tensor([group.rank, self._committed_index, latest,
                                                self._previous_commits, int(after_reset)], dtype=torch.int64))

        def holdings_of(rows: list[torch.Tensor]) -> list[Holding]:
            return [Holding(*(int(x) for x in row[:4].tolist())) for row in rows]

        rows = gather()  # (before the build: a newcomer that will be sent a commit skips initializing)
        holdings = holdings_of(rows)
        count = consistent_commit(holdings, group.size)
        # A newcomer to a ring that holds a commit whole (every shard index) is sent that commit
        # (it holds none of it), so the commit overwrites whatever its build would initialize.
        blind = self._commits == 0 and count is not None and count > 0
        rebuilt = self._ensure_built(commit_coming=blind)
        if not any(name in self._snapshot.skeleton for name in self._handlers):  # never committed with them
            if blind:  # (what it built holds no values: not a commit, a peer's is coming)
                self._holds_nothing = True
            else:
                self._snapshot.capture(self._entries())
                self._committed_index = group.rank
        resumed = False
        if self._dcp is not None and not self._tried_disk and all(int(row[2]) <= 0 for row in rows):
            self._tried_disk = True
            resumed = self._resume_from_checkpoint()
            if resumed:
                rows = gather()
                holdings = holdings_of(rows)
                count = consistent_commit(holdings, group.size)
        any_reset = resumed or any(int(row[4]) for row in rows)
        if count is None:
            raise RuntimeError(
                "no commit is held whole by the workers left: every worker that held some shard's latest commits "
                "is gone. Restart the job (from a checkpoint written with torch.distributed.checkpoint, if any)")
        went_back = self._commits != count and self._previous_commits == count
        if went_back:  # a commit ahead of what the ring holds whole: back to the previous one (it may send it)
            self._snapshot, self._previous = self._previous, self._snapshot
            self._commits = count
        mine = SyncProof(plain=self._plain_digest(), loads=(rebuilt and not resumed) or went_back,
                         covers=set(self._handlers) <= set(self._snapshot.skeleton),
                         callbacks=bool(self._reset_callbacks))
        vectors: list[list[int]] = [[int(x) for x in row.tolist()] for row in comm.allgather(torch.tensor(
            [*fingerprint(self._snapshot), mine.plain, mine.loads, mine.covers, mine.callbacks], dtype=torch.int64))]
        fingerprints = [tuple(vector[:3]) for vector in vectors]
        plan = transfers(holdings, fingerprints, count, group.size)
        proven = equal_by_sync([SyncProof(v[3], bool(v[4]), bool(v[5]), bool(v[6])) for v in vectors], plan, resumed)
        self.healed_bytes = _move_shards(self._snapshot, comm, plan,
                                         self._receive_spare(any(comm.rank in t.to for t in plan)))
        received = self.healed_bytes > 0
        if received:
            self._commits = count
            self._holds_nothing = False
            if proven:  # (the guard will not compare it: what arrived is checked against what was sent)
                _check_received(self._snapshot, plan, fingerprints, comm.rank)
        self._proven_by_sync = proven
        self._previous_commits = NONE
        self._committed_index = group.rank
        if blind and rebuilt:
            self._rebuild_uncommitted()
        if (rebuilt and not resumed) or received or went_back:
            held = self._values_kept and self._live_is_commit and not (received or went_back or resumed)
            self._load_entries(self._snapshot, held=held and self._commits == count)
        self._kept_memory, self._live_is_commit, self._reserved = {}, False, None
        ctx.note_commit(self._commits, received=self._commits != held or received)
        ctx.figures.sync(time.perf_counter() - started)
        sent_to = tuple(sorted(r for t in plan for r in t.to))
        return SyncPlan(sent_to, sent_to, any_reset, plan[0].root if plan else 0)

    def _receive_spare(self, receiving: bool) -> HostSnapshot | None:
        """Buffers this rank receives a commit into, faulted in already: a newcomer's reserved
        ones (`newcomer_memory`); a rank that committed before (the member of a lost group that
        comes back with a newcomer), its commit before the last, given up now (a received commit
        replaces both), so that its old commit's buffers then take its next own commit. Fresh
        buffers fault every page as they are written: 0.06 s more for 120 MB here, in the sync
        the survivors wait for. None when nothing fits (the receive allocates)."""
        if self._reserved is not None:
            return self._reserved.staging
        if not receiving or not self._previous.allocations or self._previous.pinned:
            return None
        self._previous_commits = NONE  # (given up before a byte is written: a sender dying halfway finds it gone)
        self._previous.forget()
        return self._previous

    def _plain_digest(self) -> int:
        """The digest of the commit's plain entries (attributes, samplers: all but what build()
        made), canonical as the replica guard's."""
        skeleton = self._snapshot.skeleton
        plain = {name: sub for name, sub in skeleton.items() if name not in self._handlers}
        return tree_digest(unflatten(plain, self._snapshot.tensors))

    def verify_replicas(self) -> bool:
        """The replica guard, unless the sync that just ran proved the ranks equal (`equal_by_sync`:
        every rank loaded a commit whose bytes equal its replicas', no reset callback of the
        script's ran since): its collective would only wait for the slowest newcomer's load to
        learn nothing, while the survivors could be training. False when it did not compare."""
        proven, self._proven_by_sync = self._proven_by_sync, False
        return False if proven else super().verify_replicas()

    def _live_differences(self, comm: Communicator) -> dict[int, tuple[str, ...]]:
        """The replica guard's comparison: the plain attributes across the ring, the shards among
        the ranks of each shard index; the same verdict on every rank (one allgather)."""
        entries = self._entries()
        plain = {name: value for name, value in entries.items() if name not in self._handlers}
        sharded = {name: entries[name] for name in self._handlers}
        return compare_live_state_in_groups(plain, sharded, comm, replica_group().size)


def _check_received(snapshot: HostSnapshot, plan: list[Transfer], fingerprints: Sequence[tuple[int, ...]],
                    rank: int) -> None:
    """The commit this rank received has the bytes its sender's digest announced, or the worker
    stops: training on other bytes than its replicas' would silently train another model."""
    root = next(transfer.root for transfer in plan if rank in transfer.to)
    if snapshot.data_digest() != fingerprints[root][2]:
        raise ReplicasDivergedError(
            f"the commit received from rank {root} does not have the bytes rank {root} announced (its digest "
            "differs): the transfer was corrupted on the way; this worker stops and its replica group is refilled")


def _move_shards(snapshot: HostSnapshot, comm: Communicator, plan, spare: HostSnapshot | None = None) -> int:
    """Carry out `plan` (`shard_plan.transfers`) on this rank, in the plan's order on every
    rank (so sends and receives pair up). A receiver takes the commit only once all of it
    arrived: a sender that dies halfway leaves it its own last commit, whole. `spare`: buffers
    to receive into (`_receive_spare`), given the replaced commit's buffers once it arrived.
    Returns the bytes this rank received (0: none)."""
    staged: HostSnapshot | None = None
    skeleton_bytes = 0
    for transfer in plan:
        if comm.rank == transfer.root:
            payload = io.BytesIO()
            torch.save(snapshot.skeleton, payload)
            data = torch.frombuffer(bytearray(payload.getvalue()), dtype=torch.uint8)
            for dst in transfer.to:
                comm.send(torch.tensor([data.numel()], dtype=torch.int64), dst)
                comm.send(data, dst)
                for buffer in snapshot.buffers:
                    comm.send(buffer, dst)
        elif comm.rank in transfer.to:
            length = comm.recv_(torch.zeros(1, dtype=torch.int64), transfer.root)
            size = int(length.item())
            if not 0 < size <= MAX_SKELETON_BYTES:
                raise RuntimeError(f"rank {transfer.root} announced a commit skeleton of {size} bytes (at most "
                                   f"{MAX_SKELETON_BYTES}): its commit cannot be taken")
            data = comm.recv_(torch.empty(size, dtype=torch.uint8), transfer.root)
            skeleton_bytes = size
            skeleton = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)
            staged = snapshot.incoming(skeleton, spare)
            for buffer in staged.buffers:
                comm.recv_(buffer, transfer.root)
    if staged is None:
        return 0
    snapshot.replace(staged, old_to=spare)
    return snapshot.nbytes + skeleton_bytes
