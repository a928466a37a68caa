"""`hvd.elastic`: run a training function that survives failures and follows host changes."""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

from worker.errors import HorovodInternalError, HostsUpdatedInterrupt
from worker.torch.elastic.sampler import ElasticSampler
from worker.torch.elastic.state import ObjectState, State, TorchState

T = TypeVar("T")


def _say(message: str) -> None:
    from worker import torch as hvd

    print(f"ringmaster-worker[{hvd.context().worker_id}]: {message}", file=sys.stderr, flush=True)


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
        while True:
            if reset_required:
                context.rejoin(failure)
                state.on_reset()
                rank, size = context.topology()[:2]
                _say(f"joined generation {context.assignment.generation} as rank {rank} of {size}")
            try:
                if not skip_sync:
                    state.sync()
                    state.save()
                result = func(state, *args, **kwargs)
            except HorovodInternalError as exc:
                failure = str(exc)
                state.restore()
                _say(f"rolled back to commit {state.commits} after: {failure}")
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                failure = ""
                skip_sync = exc.skip_sync
            else:
                context.report_done()
                return result
            reset_required = True

    return wrapper


__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]
