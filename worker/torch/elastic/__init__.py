"""`hvd.elastic`: run a training function that survives failures and follows host changes."""

from __future__ import annotations

import functools
import time
from typing import Callable, TypeVar

from torch.profiler import record_function

from worker.context import say
from worker.errors import HorovodInternalError, HostsUpdatedInterrupt
from worker.torch.elastic.sampler import ElasticSampler
from worker.torch.elastic.state import ObjectState, State, TorchState

T = TypeVar("T")


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Decorate `train(state, ...)`. On a peer's failure every survivor restores its last commit,
    the ring is re-formed without the dead and training re-enters `func`; on a host update
    (raised at a commit) the ring is re-formed with nothing rolled back.

    Each time `func` is (re-)entered, every rank holds the same state: rank 0's commit is
    synced to whoever differs (newcomers), then every rank runs the reset callbacks when the
    ring came out of a reset, then the replica guard proves every rank's live state equal to
    rank 0's (`State.verify_replicas`)."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs) -> T:
        from worker import torch as hvd

        hvd.init()
        context = hvd.context()
        context.enter_elastic()
        reset = False
        skip_sync = False
        failure = ""
        state.save()  # the live state as it enters training (it may have changed since construction)
        while True:
            if reset:
                with record_function("ringmaster.rejoin"):
                    context.rejoin(failure)
            try:
                _enter_generation(state, context, reset, skip_sync)
                result = func(state, *args, **kwargs)
            except HorovodInternalError as exc:
                failure = str(exc)
                with record_function("ringmaster.restore"):
                    state.restore()
                say(f"rolled back to commit {state.commit_count} after: {failure}")
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                failure = ""
                skip_sync = exc.skip_sync
                if not exc.committed:
                    state.save()  # raised outside a commit: the ring goes on from the live state
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
    if not skip_sync:
        with record_function("ringmaster.sync"):
            after_reset = state.sync_committed(after_reset=reset).after_reset
    synced = time.perf_counter()
    with record_function("ringmaster.reset_callbacks"):
        if after_reset:
            state.on_reset()
        else:
            state.reset()
    checked = time.perf_counter()
    with record_function("ringmaster.verify_replicas"):
        state.verify_replicas()
    done = time.perf_counter()
    if reset:
        waited, built = context.last_join_s
        rank, size = context.topology()[:2]
        generation = context.assignment.generation if context.assignment else 0
        say(
            f"joined generation {generation} as rank {rank} of {size}: waited {waited * 1e3:.0f} ms for the ring, "
            f"built it in {built * 1e3:.0f} ms, synced state in {(synced - started) * 1e3:.0f} ms, "
            f"reset callbacks {(checked - synced) * 1e3:.0f} ms, replica check {(done - checked) * 1e3:.0f} ms"
        )


__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]
