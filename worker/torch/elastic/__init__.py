"""`hvd.elastic`: run a training function that survives failures and follows host changes."""

from __future__ import annotations

import functools
import os
import time
import traceback
from typing import TYPE_CHECKING, Callable, TypeVar

import torch.distributed as dist
from torch.profiler import record_function

from ringmaster.torch.basics import context as current_context
from ringmaster.torch.basics import init
from ringmaster.torch.elastic.generation_mesh import mesh
from ringmaster.torch.elastic.generation_mesh import release as release_mesh
from ringmaster.torch.elastic.groups import ReplicaGroup, replica_group
from ringmaster.torch.elastic.sampler import ElasticSampler
from ringmaster.torch.elastic.state import ObjectState, State, TorchState
from ringmaster.worker.train.context import WorkerContext
from ringmaster.worker.train.errors import HorovodInternalError, HostsUpdatedInterrupt
from ringmaster.worker.train.say import Kind, say

if TYPE_CHECKING:
    from ringmaster.torch.elastic.sharded_state import ShardedState

T = TypeVar("T")


def __getattr__(name: str) -> object:
    """`ShardedState` is imported on first use: it brings torch.distributed.checkpoint and DTensor
    (a second of CPU per worker), which only jobs of sharded state need."""
    if name == "ShardedState":
        from ringmaster.torch.elastic.sharded_state import ShardedState

        return ShardedState
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: torch.distributed's errors of a transport: a peer's failure, whatever the rendezvous says.
PEER_FAILURES: tuple[type[Exception], ...] = (dist.DistBackendError, dist.DistNetworkError)
#: How long another error raised inside torch.distributed (Gloo's "Connection reset by peer" is
#: a plain RuntimeError) waits for the rendezvous' word that the generation is over, which makes
#: it a peer's failure too. It comes within milliseconds of a peer's death (its session closes).
MESH_FAILURE_WAIT_S = 10.0


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Decorate `train(state, ...)`. On a peer's failure every survivor restores its last commit,
    the ring is re-formed without the dead and training re-enters `func`; on a host update
    (raised at a commit) the ring is re-formed with nothing rolled back.

    Each time `func` is (re-)entered, every rank holds the same state: the newest commit in
    the ring (rank 0's, unless another rank holds more commits) is synced to whoever differs
    (newcomers), then every rank runs the reset callbacks when the
    ring came out of a reset, then the replica guard proves every rank's live state equal to
    rank 0's (`State.verify_replicas`)."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs) -> T:
        init()
        context = current_context()
        context.enter_elastic()
        reset = False
        skip_sync = False
        failure = ""
        state.save()  # the live state as it enters training (it may have changed since construction)
        while True:
            if reset:
                state.leave_generation()  # (a ShardedState lets go of the objects sharded on the mesh)
                release_mesh()  # (its peers' collectives on it fail at once, not at their timeout)
                with record_function("ringmaster.rejoin"):
                    context.rejoin(failure)
            try:
                _enter_generation(state, context, reset, skip_sync)
                result = func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as exc:
                failure = ""
                skip_sync = exc.skip_sync
                if not exc.committed:
                    state.save()  # raised outside a commit: the ring goes on from the live state
            except RuntimeError as exc:
                reason = _rollback_reason(exc, context)
                if reason is None:
                    raise
                failure = reason
                with record_function("ringmaster.restore"):
                    state.restore()
                # A worker told to leave while in a collective (a member of a leaving host, retired
                # as soon as one member reported the host update's commit, while it was still in
                # that commit's agreement) is not rolled back: it leaves, its peers hold the commit.
                if context.link is None or not context.link.leaving():
                    say(Kind.ROLLED_BACK, _generation(context), commit=state.commit_count, failure=failure)
                skip_sync = False
            else:
                context.report_done(state.finish())
                return result
            reset = True

    return wrapper


def _enter_generation(state: State, context, reset: bool, skip_sync: bool) -> None:
    """Make every rank hold the same state before training (re-)enters: sync, reset callbacks,
    replica guard. `reset` says this worker went through a reset (it rejoined)."""
    started = time.perf_counter()
    after_reset = reset
    sent_to: list[int] = []
    root = 0
    if not skip_sync:
        with record_function("ringmaster.sync"):
            plan = state.sync_committed(after_reset=reset)
            after_reset, sent_to, root = (
                plan.after_reset,
                sorted(set(plan.skeleton_to) | set(plan.tensors_to)),
                plan.root,
            )
    synced = time.perf_counter()
    with record_function("ringmaster.reset_callbacks"):
        if after_reset:
            state.on_reset()
        else:
            state.reset()
    checked = time.perf_counter()
    with record_function("ringmaster.verify_replicas"):
        compared = state.verify_replicas() is not False
    done = time.perf_counter()
    if reset:
        waited, built = context.last_join_s
        rank, size = context.topology()[:2]
        generation = _generation(context)
        say(Kind.RING_JOINED, generation, rank=rank, size=size, waited_ms=waited * 1e3,
            built_ms=built * 1e3, sync_ms=(synced - started) * 1e3, callbacks_ms=(checked - synced) * 1e3,
            check_ms=(done - checked) * 1e3, synced_to=sent_to, root=root,
            check=f"replica check {(done - checked) * 1e3:.0f} ms" if compared else "replicas proven equal by the sync")


def _rollback_reason(exc: RuntimeError, context: WorkerContext) -> str | None:
    """Why `exc` rolls training back to its last commit, or None when it is the script's own
    error (it is raised). Ringmaster's collectives say it with `HorovodInternalError`; torch's own
    on the generation's mesh (`hvd.elastic.mesh`, FSDP2's collectives) fail with errors of their
    own, which are a peer's failure when they are a transport's or the generation ended."""
    if isinstance(exc, HorovodInternalError):
        return str(exc)
    if not _raised_in_torch_distributed(exc):
        return None
    lines = str(exc).strip().splitlines()
    reason = f"{type(exc).__name__} on the generation's mesh: {lines[0][:300] if lines else 'no message'}"
    if isinstance(exc, PEER_FAILURES):
        return reason
    over = context.link.wait_generation_over(_generation(context), MESH_FAILURE_WAIT_S) if context.link else None
    return f"{reason} (generation over: {over})" if over else None


def _raised_in_torch_distributed(exc: BaseException) -> bool:
    marker = os.path.join("torch", "distributed", "")
    return any(marker in frame.f_code.co_filename for frame, _ in traceback.walk_tb(exc.__traceback__))


def _generation(context: WorkerContext) -> int:
    return context.assignment.generation if context.assignment else 0


__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "ReplicaGroup",
           "ShardedState", "State", "TorchState", "mesh", "replica_group", "run"]
