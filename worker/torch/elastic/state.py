"""Training state that survives failures: `ObjectState` and `TorchState`, as in Horovod.

`commit()` snapshots the state in memory and checks for host updates; `restore()` goes back
to the last commit after a failure; `sync()` gives every worker rank 0's state after the ring
was re-formed. Modules, optimizers and samplers get a handler each; any other keyword becomes
an attribute saved, restored and broadcast as a Python object.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.profiler import record_function

from checkpoint import snapshot
from worker.errors import HostsUpdatedInterrupt
from worker.torch.elastic.sampler import ElasticSampler


def _hvd():
    from worker import torch as hvd

    return hvd


class State:
    """Base of all elastic state: commit bookkeeping, host-update checks, reset callbacks."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._commits = 0
        self._saved_commits = 0

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called after every reset (e.g. to scale the learning rate to the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Snapshot the state, then raise HostsUpdatedInterrupt if the ring must change."""
        with record_function("ringmaster.commit"):
            self._commits += 1
            self.save()
            _hvd().context().note_commit(self._commits)
            self.check_host_updates()

    @property
    def commits(self) -> int:
        """Commits in this state's history (rolled back with it)."""
        return self._commits

    def check_host_updates(self) -> None:
        """Every rank raises at the same step: the newest update any rank has seen wins."""
        hvd = _hvd()
        ctx = hvd.context()
        if ctx.standalone:
            return
        seen = torch.tensor([ctx.link.hosts_sequence()], dtype=torch.int64)
        hvd.allreduce_(seen, op=hvd.Max)
        if int(seen.item()) > ctx.hosts_sequence_baseline():
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        self._saved_commits = self._commits

    def restore(self) -> None:
        self._commits = self._saved_commits
        _hvd().context().note_commit(self._commits)

    def sync(self) -> None:
        hvd = _hvd()
        self._saved_commits = self._commits = int(hvd.broadcast_object(self._commits, 0))
        hvd.context().note_commit(self._commits)


class ObjectState(State):
    """Plain Python attributes, saved by deep copy and broadcast from rank 0."""

    def __init__(self, bcast_object: Callable | None = None, get_rank: Callable | None = None, **kwargs: Any) -> None:
        super().__init__()
        self._bcast_object = bcast_object
        self._saved_state: dict[str, Any] = {}
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._object_names = list(kwargs)
        ObjectState.save(self)

    def save(self) -> None:
        super().save()
        self._saved_state = {name: snapshot(getattr(self, name)) for name in self._object_names}

    def restore(self) -> None:
        super().restore()
        for name, value in self._saved_state.items():
            setattr(self, name, snapshot(value))

    def sync(self) -> None:
        super().sync()
        if self._object_names:
            bcast = self._bcast_object or _hvd().broadcast_object
            self._saved_state = bcast(self._saved_state, 0)
            for name, value in self._saved_state.items():
                setattr(self, name, snapshot(value))


class _ModelHandler:
    """Save, restore and sync one stateful object (a module here; subclasses for others)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self.saved = snapshot(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        _hvd().broadcast_parameters(self.value.state_dict(), root_rank=0)

    def on_reset(self) -> None:
        pass


class _OptimizerHandler(_ModelHandler):
    def restore(self) -> None:
        # load_state_dict may keep references to the tensors it is given: hand it a copy.
        self.value.load_state_dict(snapshot(self.saved))

    def sync(self) -> None:
        _hvd().broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_ModelHandler):
    def restore(self) -> None:
        self.value.load_state_dict(snapshot(self.saved))

    def sync(self) -> None:
        self.value.load_state_dict(_hvd().broadcast_object(self.value.state_dict(), 0))

    def on_reset(self) -> None:
        self.value.reset()


def _handler_for(value: Any):
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """State of a PyTorch job: `TorchState(model=model, optimizer=opt, sampler=s, epoch=0, batch=0)`."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        if model is not None:
            kwargs["model"] = model
        if optimizer is not None:
            kwargs["optimizer"] = optimizer
        handled = {}
        plain = {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handled[name] = handler
        self._handlers = handled
        for name, handler in handled.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(**plain)

    def _each_handler(self, action: str) -> None:
        for handler in self._handlers.values():
            getattr(handler, action)()

    def save(self) -> None:
        self._each_handler("save")
        super().save()

    def restore(self) -> None:
        self._each_handler("restore")
        super().restore()

    def sync(self) -> None:
        self._each_handler("sync")
        super().sync()

    def on_reset(self) -> None:
        self._each_handler("on_reset")
        super().on_reset()
