"""Split nested training state into its tensors and a tensor-free skeleton, and join them again.

A state dict (modules, optimizers, samplers, plain objects) is a tree of dicts, lists and
tuples. Everything that moves bytes (commits, newcomer sync, durable writes) wants the tensors
as one flat list it can copy or send in bulk; the rest of the tree is small and travels as a
Python object. The skeleton keeps a `TensorRef` where each tensor was, so the tree can be
rebuilt around any list of tensors with the same layout.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class TensorRef:
    """Where the `index`-th tensor of a flattened tree was, and what it looked like. The device
    is left out on purpose: ranks on different GPUs hold equal skeletons."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    def __deepcopy__(self, memo: dict) -> "TensorRef":
        return self  # immutable: copying a skeleton need not rebuild its references

    def __copy__(self) -> "TensorRef":
        return self


#: (shape, dtype) of every tensor in order: two trees with equal layouts can share buffers.
Layout = tuple[tuple[tuple[int, ...], torch.dtype], ...]


def _map_tree(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """The tree rebuilt (dicts, ordered dicts, lists, tuples) with `leaf` applied to the rest."""
    if isinstance(value, OrderedDict):
        return OrderedDict((k, _map_tree(v, leaf)) for k, v in value.items())
    if type(value) is dict:
        return {k: _map_tree(v, leaf) for k, v in value.items()}
    if type(value) is list:
        return [_map_tree(v, leaf) for v in value]
    if type(value) is tuple:
        return tuple(_map_tree(v, leaf) for v in value)
    return leaf(value)


def flatten(tree: Any, start: int = 0) -> tuple[Any, list[torch.Tensor]]:
    """(skeleton, tensors): the tree with each tensor replaced by a `TensorRef` (numbered from
    `start`), and the tensors (detached, not copied). Non-tensor leaves are kept as they are."""
    tensors: list[torch.Tensor] = []

    def leaf(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value.detach())
            return TensorRef(start + len(tensors) - 1, tuple(value.shape), value.dtype)
        return value

    return _map_tree(tree, leaf), tensors


def tensor_refs(skeleton: Any) -> list[TensorRef]:
    """The `TensorRef`s of a skeleton, in walk order."""
    refs: list[TensorRef] = []

    def walk(value: Any) -> None:
        if isinstance(value, TensorRef):
            refs.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(skeleton)
    return refs


def has_plain_leaves(skeleton: Any) -> bool:
    """True when the tree holds anything but containers and tensors (such leaves cannot be
    restored by copying tensors in place)."""
    if isinstance(skeleton, TensorRef):
        return False
    if isinstance(skeleton, dict):
        return any(has_plain_leaves(v) for v in skeleton.values())
    if isinstance(skeleton, (list, tuple)):
        return any(has_plain_leaves(v) for v in skeleton)
    return True


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """The tree with each `TensorRef` replaced by `tensors[ref.index]` (not copied)."""
    return _map_tree(skeleton, lambda value: tensors[value.index] if isinstance(value, TensorRef) else value)


def layout_of(tensors: list[torch.Tensor]) -> Layout:
    return tuple((tuple(t.shape), t.dtype) for t in tensors)


def skeleton_digest(skeleton: Any) -> int:
    """A 63-bit fingerprint of a skeleton (its objects and tensor layout), equal on every process
    that holds an equal skeleton."""
    payload = pickle.dumps(skeleton, protocol=4)
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "little") >> 1
