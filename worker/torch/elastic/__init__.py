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
    (raised at a commit) the ring is re-formed with nothing rolled back. Newcomers receive the
    state from rank 0 before they start."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs) -> T:
        from worker import torch as hvd

        hvd.init()
        context = hvd.context()
        context.enter_elastic()
        reset_required = False
        skip_sync = False
        failure = ""
        joined = False
        state.save()  # the live state as it enters training (it may have changed since construction)
        while True:
            if reset_required:
                with record_function("ringmaster.rejoin"):
                    context.rejoin(failure)
                    state.on_reset()
                joined = True
            try:
                if not skip_sync:
                    synced = time.perf_counter()
                    with record_function("ringmaster.sync"):
                        state.sync_committed()
                    synced = time.perf_counter() - synced
                if joined:
                    joined = False
                    waited, built = context.last_join_s
                    rank, size = context.topology()[:2]
                    generation = context.assignment.generation if context.assignment else 0
                    say(
                        f"joined generation {generation} as rank {rank} of {size}: waited "
                        f"{waited * 1e3:.0f} ms for the ring, built it in {built * 1e3:.0f} ms, synced state in "
                        f"{0.0 if skip_sync else synced * 1e3:.0f} ms"
                    )
                result = func(state, *args, **kwargs)
            except HorovodInternalError as exc:
                failure = str(exc)
                with record_function("ringmaster.restore"):
                    state.restore()
                say(f"rolled back to commit {state.commits} after: {failure}")
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                failure = ""
                skip_sync = exc.skip_sync
            else:
                state.finish()
                context.report_done()
                return result
            reset_required = True

    return wrapper


__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]
