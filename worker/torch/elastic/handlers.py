"""How a state commits and restores each object it holds, one set for `TorchState` and
`ShardedState`: a module, an optimizer, a learning-rate scheduler, an `ElasticSampler`, and a
module or optimizer sharded with FSDP2. Every handler has the same interface (`state_dict`,
`load(snapshot, name, held, kept)`, `on_reset`, `memory`), so a state never needs to know which
kind it holds (a scheduler that `build(mesh)` returned once raised `TypeError` at the first
commit loaded: its handler took fewer arguments than the sharded state gave). The sharded ones
import DTensor and the sharding machinery when first used: a plain worker's start imports neither
(tests/project/test_start_up_imports.py)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from ringmaster.checkpoint.memory import HostSnapshot
from ringmaster.checkpoint.tree import flatten, has_plain_leaves
from ringmaster.torch.elastic.sampler import ElasticSampler
from ringmaster.worker.train.errors import CheckpointMismatchError

SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


class ModelHandler:
    """Commit and restore one stateful object (a module here; subclasses for others)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def state_dict(self) -> Any:
        return self.value.state_dict()

    def load(self, snapshot: HostSnapshot, name: str, held: bool = False, kept: Any = None) -> None:
        """Load entry `name` of `snapshot`, in place when the layout is unchanged (references held
        elsewhere stay valid). `held` and `kept` are a sharded object's (see `ShardedModule`)."""
        if has_plain_leaves(snapshot.plain(name)) or not snapshot.copy_into(name, self.value.state_dict()):
            self.value.load_state_dict(snapshot.materialize(name))

    def on_reset(self) -> None:
        """Called at every reset of the ring."""

    def memory(self) -> Any:
        """What of the object the next generation's build can take as its memory (`kept_memory`)."""
        return None


class OptimizerHandler(ModelHandler):
    def load(self, snapshot: HostSnapshot, name: str, held: bool = False, kept: Any = None) -> None:
        saved = snapshot.plain(name)
        if has_plain_leaves(saved.get("state", {})) or len(saved["param_groups"]) != len(self.value.param_groups) \
                or not snapshot.copy_into(name, self.value.state_dict()):
            # load_state_dict may keep references to what it is given: materialize() is a copy.
            self.value.load_state_dict(snapshot.materialize(name))
            return
        # tensors are back in place; hyperparameters (a scheduled lr, ...) come from the commit
        for group, committed in zip(self.value.param_groups, saved["param_groups"]):
            group.update({k: copy.deepcopy(v) for k, v in committed.items() if k != "params"})


class SchedulerHandler(ModelHandler):
    """A learning-rate scheduler: its counters (`last_epoch`, `base_lrs`, ...) are committed,
    restored and synced like the optimizer whose lr it sets; kept as a plain attribute it would
    be deep-copied together with its optimizer. Nothing of it is sharded, nor kept as memory."""

    def load(self, snapshot: HostSnapshot, name: str, held: bool = False, kept: Any = None) -> None:
        self.value.load_state_dict(snapshot.materialize(name))


class SamplerHandler(SchedulerHandler):
    def on_reset(self) -> None:
        self.value.reset()


def _local(tree: Any) -> Any:
    """`tree` with every DTensor replaced by its local shard (a view: writing it writes the shard)."""
    from torch.distributed.tensor import DTensor

    def local(node: Any) -> Any:
        if isinstance(node, DTensor):
            return node.to_local()
        if isinstance(node, dict):
            return {k: local(v) for k, v in node.items()}
        if isinstance(node, list):
            return [local(v) for v in node]
        return node

    return local(tree)


class ShardedModule(ModelHandler):
    """A module sharded with FSDP2: its committed tree is its state dict's local shards."""

    def state_dict(self) -> Any:
        return _local(self.value.state_dict())

    def load(self, snapshot: HostSnapshot, name: str, held: bool = False, kept: Any = None) -> None:
        """`held`: the module's memory is the one that holds those values already (a survivor's,
        `kept_memory`), only its layout is checked."""
        if not (snapshot.fits(name, self.state_dict()) if held else snapshot.copy_into(name, self.state_dict())):
            raise CheckpointMismatchError(
                f"the committed shards of {name!r} do not fit the {type(self.value).__name__} that build() made in "
                "this generation: build(mesh) must make the same model, sharded the same way, every time")

    def memory(self) -> Any:
        from ringmaster.worker.sharding import kept_memory

        return kept_memory.local_tensors(self.value)


class ShardedOptimizer(ShardedModule):
    """An optimizer of sharded parameters: a fresh one (no state yet) gets its committed state
    as DTensors placed as its parameters are."""

    def load(self, snapshot: HostSnapshot, name: str, held: bool = False, kept: Any = None) -> None:
        """`kept`: the state tensors of this worker's optimizer of the last generation (flat, in
        the commit's order), used as the new one's memory where they fit; `held`: they hold the
        commit's values already."""
        from torch.distributed.tensor import DTensor

        from ringmaster.worker.sharding import kept_memory

        optimizer: torch.optim.Optimizer = self.value
        if optimizer.state and snapshot.copy_into(name, self.state_dict()):
            for group, committed in zip(optimizer.param_groups, snapshot.plain(name)["param_groups"]):
                group.update({k: v for k, v in committed.items() if k != "params"})
            return
        layout, devices = snapshot.entry_layout(name)
        into = kept if kept is not None and kept_memory.fits(kept, layout, devices) else None
        saved = snapshot.materialize(name, into=into, copy_values=not (held and into is not None))
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for index, entries in saved.get("state", {}).items():
            if not isinstance(index, int) or not 0 <= index < len(params):
                raise CheckpointMismatchError(f"the committed state of {name!r} names parameter {index!r}, which the "
                                              f"optimizer build() made does not have ({len(params)} parameters)")
            param = params[index]
            if not isinstance(param, DTensor):
                continue
            for key, value in list(entries.items()):
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == param.to_local().shape:
                    entries[key] = DTensor.from_local(value, param.device_mesh, param.placements, run_check=False,
                                                      shape=param.shape, stride=param.stride())
        optimizer.load_state_dict(saved)

    def memory(self) -> Any:
        return flatten(self.state_dict())[1]


#: The handler of each kind of object, for a `TorchState` and for what a `ShardedState`'s build makes.
_PLAIN: tuple[tuple[type | tuple[type, ...], type[ModelHandler]], ...] = (
    (torch.nn.Module, ModelHandler), (torch.optim.Optimizer, OptimizerHandler), (SCHEDULERS, SchedulerHandler),
    (ElasticSampler, SamplerHandler))
_SHARDED: tuple[tuple[type | tuple[type, ...], type[ModelHandler]], ...] = (
    (torch.nn.Module, ShardedModule), (torch.optim.Optimizer, ShardedOptimizer), (SCHEDULERS, SchedulerHandler))


def handler_for(value: Any) -> ModelHandler | None:
    """A `TorchState`'s handler of `value`, or None: a plain attribute."""
    return next((handler(value) for kinds, handler in _PLAIN if isinstance(value, kinds)), None)


def sharded_handler_for(name: str, value: Any) -> ModelHandler:
    """The handler of what `ShardedState`'s `build(mesh)` made; TypeError names what it cannot hold."""
    handler = next((handler(value) for kinds, handler in _SHARDED if isinstance(value, kinds)), None)
    if handler is None:
        raise TypeError(f"build(mesh) returned {name}={type(value).__name__}: give modules, optimizers and "
                        "learning-rate schedulers there, and plain values to ShardedState(...) itself")
    return handler
