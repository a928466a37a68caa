"""Training state that survives failures: `ObjectState` and `TorchState`, as in Horovod.

`commit()` copies the state into a `HostSnapshot` (host buffers allocated once and reused,
never a second copy on the GPU) and checks for host updates; every N commits rank 0 also hands
the commit to the durable checkpoint writer. `restore()` copies the last commit back in place.
After the ring was re-formed, `elastic.run` aligns every rank's commit with the newest one in
the ring (rank 0's unless another rank holds more commits), moving only what differs (see
`ringmaster.worker.train.state_sync`); a job starting with no commit anywhere resumes from the newest durable checkpoint
that verifies. Then every rank runs the reset callbacks on that same state, and the replica guard (`verify_replicas`)
proves the ranks identical.

Modules, optimizers, learning-rate schedulers and samplers get a handler each; any other
keyword becomes an attribute saved, restored and broadcast as a Python object.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.profiler import record_function

from ringmaster.checkpoint import fit
from ringmaster.checkpoint.memory import HostSnapshot
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.torch.basics import Max, context, is_initialized
from ringmaster.torch.collectives import allreduce_, broadcast_object
from ringmaster.torch.elastic.handlers import handler_for
from ringmaster.torch.elastic.sampler import ElasticSampler
from ringmaster.worker.train.checkpointing import Checkpointing
from ringmaster.worker.train.collectives import wait_until
from ringmaster.worker.train.errors import CheckpointMismatchError, HostsUpdatedInterrupt, ReplicasDivergedError
from ringmaster.worker.train.replica_guard import compare_live_state, describe
from ringmaster.worker.train.say import Kind, say
from ringmaster.worker.train.state_sync import SyncPlan, sync_snapshot

#: Snapshot entry with the state's own bookkeeping (the commit count); also in checkpoints.
RINGMASTER_ENTRY = "ringmaster"


class State:
    """Base of all elastic state: commits, host-update checks, reset callbacks, durable checkpoints."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._commits = 0
        self._snapshot = HostSnapshot()
        self._durable = Checkpointing.from_environ(
            lambda message: say(Kind.CHECKPOINT_WRITE_FAILED, error=message),
            report_load=lambda message: say(Kind.CHECKPOINT_SKIPPED, reason=message),
            report_written=lambda message: say(Kind.CHECKPOINT_WRITTEN, detail=message),
        )
        self._tried_disk = False
        self._resumed = False  # loaded a durable checkpoint that the ring has not synced yet

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called after every reset (e.g. to scale the learning rate to the new size).

        They run on every rank of the new ring, newcomers included, after the ring was formed
        and every rank holds rank 0's state, so `hvd.size()`/`hvd.rank()` are the new ones and
        each rank applies them to the same state (also after resuming from a durable
        checkpoint, which another ring wrote)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After a reset: re-align objects with the new ring (`reset`), then the callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self) -> None:
        """Re-align objects with the current ring (TorchState re-deals its samplers)."""

    def leave_generation(self) -> None:
        """This worker leaves its generation's ring to join the next one, its live state equal to
        its commit (`ShardedState` lets go of the objects built on the generation's mesh)."""

    def commit(self) -> None:
        """Snapshot the state, then raise HostsUpdatedInterrupt if the ring must change."""
        ctx = context()
        with record_function("ringmaster.commit"), ctx.spans.span(pb.SPAN_COMMIT):
            started = time.perf_counter()
            self._commits += 1
            self.save()
            ctx.note_commit(self._commits, new=True)
            if self._durable is not None:
                rank, size = ctx.topology()[:2]
                generation = ctx.assignment.generation if ctx.assignment else 0
                self._durable.after_commit(self._snapshot, self._commits, rank, size, generation)
                ctx.figures.checkpoints = self._durable.writer.figures
            ctx.figures.commit(time.perf_counter() - started)
            try:
                self.check_host_updates()
            except HostsUpdatedInterrupt as exc:
                exc.committed = True  # the live state is this commit: nothing to save before the sync
                raise

    @property
    def commit_count(self) -> int:
        """Commits in this state's history (rolled back with it). Not called `commits`: Horovod
        scripts keep a counter of their own by that name (`TorchState(..., commits=0)`)."""
        return self._commits

    def host_update_pending(self) -> bool:
        """True when the rendezvous announced a new ring that this worker has not joined yet:
        the next `commit()`/`check_host_updates()` raises `HostsUpdatedInterrupt`. A local look,
        no collective (so ranks may see it at different moments; the interrupt itself is agreed)."""
        ctx = context()
        if ctx.link is None:
            return False
        baseline = ctx.hosts_sequence_baseline()
        return ctx.link.hosts_sequence() > baseline or ctx.link.claimed_sequence() > baseline

    def wait_for_host_update(self, timeout_s: float) -> bool:
        """Block until the hosts change (True) or `timeout_s` passes (False), woken by the notice
        itself: what Horovod scripts do by polling `state._host_messages.empty()`.

        Newcomers are announced as soon as their hosts are found, and the interrupt normally
        waits until they are ready, so the members train on meanwhile. A script that waits here
        is not training: the announcement is enough, and its next commit resets; the next ring
        waits for the newcomers (as Horovod's reset does)."""
        link = context().link
        if link is None:
            return self.host_update_pending()
        woken = threading.Event()
        link.add_waiter(woken)
        try:
            return wait_until(woken, self._changed_hosts, timeout_s, lambda: None)
        finally:
            link.remove_waiter(woken)

    def _changed_hosts(self) -> bool:
        """A host update is pending, or newcomers were announced (claimed: the next commit resets)."""
        ctx = context()
        if self.host_update_pending():
            return True
        return ctx.link is not None and ctx.link.claim_announced(ctx.hosts_sequence_baseline()) > 0

    @property
    def _host_messages(self) -> "_PendingHostUpdates":
        """Horovod's private queue of host-update notices, as scripts poll it
        (`while state._host_messages.empty(): ...`); `wait_for_host_update()` is the public form."""
        return _PendingHostUpdates(self)

    @property
    def snapshot(self) -> HostSnapshot:
        """The last commit (read-only for callers)."""
        return self._snapshot

    def check_host_updates(self) -> None:
        """Every rank raises at the same step: the newest update any rank has seen wins."""
        ctx = context()
        if ctx.link is None:  # a job of one, outside `ringmaster run`
            self._durable_agreed(self._durable_vote())
            return
        updated = ctx.link.hosts_sequence()
        seen = torch.tensor([max(updated, ctx.link.claimed_sequence()), ctx.link.checkpoint_sequence(),
                             self._durable_vote()], dtype=torch.int64)
        allreduce_(seen, op=Max)
        newest, checkpoint, durable = (int(v) for v in seen.tolist())
        self._durable_agreed(bool(durable))
        if newest > ctx.hosts_sequence_baseline():
            if checkpoint > ctx.hosts_sequence_baseline():
                self._make_durable(ctx)
            if newest > updated:  # an announcement a script awaited, before its update came: say so
                ctx.link.awaits_hosts(newest)
            raise HostsUpdatedInterrupt(skip_sync=False)

    def _durable_vote(self) -> bool:
        """Whether this rank asks the ring for a collective durable checkpoint at this commit
        (`ShardedState`'s; rank 0's writer of whole states needs no agreement)."""
        return False

    def _durable_agreed(self, due: bool) -> None:
        """Some rank asked for a collective durable checkpoint at this commit (`due`), every
        rank hears it in the same commit."""

    def _make_durable(self, ctx) -> None:
        """A drain leaves too few workers: rank 0 writes this commit to --checkpoint-dir and waits
        for the disk before anyone leaves, so the job resumes from it."""
        if self._durable is None:
            return
        rank, size = ctx.topology()[:2]
        generation = ctx.assignment.generation if ctx.assignment else 0
        warning = self._durable.finish(self._snapshot, self._commits, rank, size, generation)
        if warning:
            print(f"ringmaster: {warning}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ what a commit holds
    def _entries(self) -> dict[str, Any]:
        """Named live trees of this state; subclasses add theirs."""
        return {RINGMASTER_ENTRY: {"commits": self._commits}}

    def _load_entries(self, snapshot: HostSnapshot) -> None:
        """Make the live state equal to `snapshot`; subclasses load theirs."""
        if RINGMASTER_ENTRY in snapshot.skeleton:
            self._commits = int(snapshot.plain(RINGMASTER_ENTRY)["commits"])

    # ------------------------------------------------------------ Horovod's State API
    def save(self) -> None:
        """Copy the live state into the commit (no commit counted, no host check)."""
        self._snapshot.capture(self._entries())

    def restore(self) -> None:
        """Go back to the last commit."""
        ctx = context()
        with ctx.spans.span(pb.SPAN_RESTORE):
            self._load_entries(self._snapshot)
        ctx.note_commit(self._commits)
        ctx.figures.rollback()

    def sync(self) -> None:
        """Give every worker rank 0's current state (commits it first)."""
        self.save()
        self.sync_committed()

    def sync_committed(self, after_reset: bool = False) -> SyncPlan:
        """Give every worker the ring's newest commit (the most commits; rank 0's when it holds
        that many: `state_sync`), moving only what differs, and load it where it changed. Called by `elastic.run` after
        each reset, when every live state equals its commit. A rank 0 that never committed first looks for a durable
        checkpoint.

        `after_reset` says this rank went through a reset; the plan returned says whether any
        rank did (or rank 0 resumed from a checkpoint): then reset callbacks are due everywhere."""
        with context().spans.span(pb.SPAN_SYNC):
            return self._sync_committed(after_reset)

    def _sync_committed(self, after_reset: bool) -> SyncPlan:
        started = time.perf_counter()
        comm = context().communicator()
        if comm.rank == 0 and self._commits == 0 and self._durable is not None and not self._tried_disk:
            self._tried_disk = True
            self._resume_from_disk()
        held = self._commits
        the_plan = sync_snapshot(self._snapshot, comm, broadcast_object, commits=self._commits,
                                 after_reset=after_reset or self._resumed)
        self._resumed = False
        if comm.rank in the_plan.skeleton_to:
            self._load_entries(self._snapshot)
        if self._durable is not None:
            self._durable.resumed(self._commits)
        context().note_commit(self._commits, received=self._commits != held)
        context().figures.sync(time.perf_counter() - started)
        return the_plan

    def verify_replicas(self) -> bool:
        """The replica guard: prove that every rank's live state equals rank 0's (one small
        allgather of per-entry digests; see `worker.replica_guard`). A difference is never
        trained on: it is logged with the entries and ranks, every rank's live state is synced
        from rank 0 once more, and if that does not make them equal the worker stops with
        `ReplicasDivergedError`. True: it compared (a `ShardedState` may know without)."""
        ctx = context()
        comm = ctx.communicator()
        found = self._live_differences(comm)
        if not found:
            return True
        generation = ctx.assignment.generation if ctx.assignment else 0
        if comm.rank == 0 or comm.rank in found:
            say(Kind.REPLICAS_DIVERGED, generation, differences=describe(found), ranks=sorted(found))
        self.save()
        self.sync_committed()
        still = self._live_differences(comm)
        if still:
            raise ReplicasDivergedError(
                f"in generation {generation} the live state still differs from rank 0's after a second sync "
                f"({describe(still)}): something makes it depend on the rank, most often a reset callback "
                "(callbacks run on every rank and must compute the same values everywhere)"
            )
        if comm.rank == 0 or comm.rank in found:
            say(Kind.REPLICAS_HEALED, generation)
        return True

    def _live_differences(self, comm) -> dict[int, tuple[str, ...]]:
        """The replica guard's comparison: which ranks' live state differs from rank 0's, and in
        which entries (the same verdict on every rank)."""
        return compare_live_state(self._entries(), comm)

    def finish(self) -> str:
        """Training returned: make the last commit durable (rank 0, when checkpoints are on).
        Returns a warning for the job's end when that failed."""
        if self._durable is None:
            return ""
        ctx = context()
        rank, size = ctx.topology()[:2]
        generation = ctx.assignment.generation if ctx.assignment else 0
        return self._durable.finish(self._snapshot, self._commits, rank, size, generation)

    def _resume_from_disk(self) -> None:
        assert self._durable is not None
        found = self._durable.load_newest()
        if found is None:
            return
        manifest, tree = found
        if not isinstance(tree, dict):
            say(Kind.CHECKPOINT_IGNORED, step=manifest.step, directory=str(self._durable.directory.path))
            return
        live = self._entries()
        where = f"the checkpoint of step {manifest.step} in {self._durable.directory.path}"
        problems = [d for name in live if name in tree and name != RINGMASTER_ENTRY
                    for d in fit.differences(tree[name], live[name], name)]
        if problems:
            raise CheckpointMismatchError(
                f"{where} does not fit this model: {'; '.join(problems[:fit.MAX_DIFFERENCES])}. Point --checkpoint-dir "
                "at this model's checkpoints, or move that folder away to start from the initial state"
            )
        missing = sorted(set(live) - set(tree) - {RINGMASTER_ENTRY})
        if missing:
            say(Kind.CHECKPOINT_PARTIAL, step=manifest.step, missing=missing)
        merged = {name: tree.get(name, value) for name, value in live.items()}
        merged[RINGMASTER_ENTRY] = {"commits": manifest.step}
        self._snapshot.capture(merged)
        try:
            self._load_entries(self._snapshot)
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointMismatchError(f"{where} could not be loaded into this model: {exc}") from None
        self._resumed = True
        say(Kind.CHECKPOINT_RESUMED, step=manifest.step, directory=str(self._durable.directory.path),
            world_size=manifest.world_size, written_in=manifest.generation)


class _PendingHostUpdates:
    """The part of a `queue.Queue` that Horovod scripts use on `state._host_messages`."""

    def __init__(self, state: State) -> None:
        self._state = state

    def empty(self) -> bool:
        """True when no host update is waiting (Horovod scripts test `state._host_messages.empty()`
        and expect the next commit to reset when it is not: an announcement counts, claimed)."""
        return not self._state._changed_hosts()

    def qsize(self) -> int:
        """How many host updates are waiting (0 or 1)."""
        return int(not self.empty())


class ObjectState(State):
    """Plain Python attributes, saved by deep copy and broadcast from rank 0. (`bcast_object`
    and `get_rank` are accepted for Horovod compatibility; the commit travels as one tree.)"""

    def __init__(self, bcast_object: Callable | None = None, get_rank: Callable | None = None, **kwargs: Any) -> None:
        super().__init__()
        for name, value in kwargs.items():
            if name == RINGMASTER_ENTRY:
                raise ValueError(f"{RINGMASTER_ENTRY!r} is reserved in elastic state; rename that attribute")
            setattr(self, name, value)
        self._object_names = list(kwargs)
        State.save(self)

    if TYPE_CHECKING:
        # The attributes are the script's own (`TorchState(model=..., epoch=0)`): to a type
        # checker, any attribute of the state is there.
        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...

    def _entries(self) -> dict[str, Any]:
        entries = super()._entries()
        entries.update({name: getattr(self, name) for name in self._object_names})
        return entries

    def _load_entries(self, snapshot: HostSnapshot) -> None:
        super()._load_entries(snapshot)
        for name in self._object_names:
            if name in snapshot.skeleton:
                setattr(self, name, snapshot.materialize(name))


class TorchState(ObjectState):
    """State of a PyTorch job: `TorchState(model=model, optimizer=opt, scheduler=sched, sampler=s,
    epoch=0, batch=0)`."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        if model is not None:
            kwargs["model"] = model
        if optimizer is not None:
            kwargs["optimizer"] = optimizer
        handled = {}
        plain = {}
        for name, value in kwargs.items():
            handler = handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handled[name] = handler
        self._handlers = handled
        for name, handler in handled.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(**plain)

    def _entries(self) -> dict[str, Any]:
        entries = super()._entries()
        entries.update({name: handler.state_dict() for name, handler in self._handlers.items()})
        return entries

    def _load_entries(self, snapshot: HostSnapshot) -> None:
        for name, handler in self._handlers.items():
            if name in snapshot.skeleton:
                handler.load(snapshot, name)
        super()._load_entries(snapshot)

    def __setattr__(self, name: str, value: Any) -> None:
        """`state.model = other_model` hands the new object to its handler (as in Horovod)."""
        handlers = self.__dict__.get("_handlers")
        if handlers and name in handlers:
            handlers[name].value = value
        super().__setattr__(name, value)

    def sync(self) -> None:
        """Give every worker rank 0's current state (commits it first), then re-deal the samplers
        over the ring, as Horovod's sync does on every rank."""
        super().sync()
        self.reset()

    def reset(self) -> None:
        """Re-align every handled object with the current ring (samplers re-deal their indices),
        then give the optimizers a global batch's terms for this generation."""
        for handler in self._handlers.values():
            handler.on_reset()
        _apply_global_batch([h.value for h in self._handlers.values()])


def _apply_global_batch(objects: list[Any]) -> None:
    """Where a sampler declares a global batch, set every `DistributedOptimizer` among `objects`
    to accumulate this rank's micro-batches of a step and to reduce to the mean over the step's
    (`set_accumulation`); the optimizers of a state without one keep Horovod's average."""
    declared = [o for o in objects if isinstance(o, ElasticSampler) and o.global_batch is not None]
    if len(declared) > 1:
        raise ValueError(f"a TorchState holds {len(declared)} samplers with a global batch: one global batch drives "
                         "the optimizer's steps, keep one such sampler in the state")
    if not declared:
        return
    sampler = declared[0]
    assert sampler.global_batch is not None
    for optimizer in (o for o in objects if callable(getattr(o, "set_accumulation", None))):
        optimizer.set_accumulation(sampler.accumulation, sampler.reduction_scale, exact=sampler.exact)
    if is_initialized():  # (the job's status and the pool's policy hear of it with the next heartbeat)
        context().figures.global_batch(sampler.global_batch.size, sampler.global_batch.micro, sampler.accumulation,
                                       sampler.sharing)
