"""Fingerprints of training state: equal state gives equal digests in every process.

Two uses: the newcomer sync compares commits (flat host buffers) to decide who needs rank 0's
bytes, and the replica guard compares each rank's *live* state after a reset to prove that
every rank trains on the same thing. Both hash every byte with xxHash (XXH3, ~25 GB/s on one
core here, faster than summing the words with numpy), so a single changed or swapped value
changes the digest; a sum of words, which the sync used before, is blind to values that trade
places.

Tree digests are canonical: dict entries are hashed in sorted key order, so two ranks whose
optimizer state dicts were filled in different orders still agree, while any difference in a
value, a type, a shape or a dtype (also -0.0 against 0.0) shows. Digests are signed 64-bit
integers, ready to travel in an int64 tensor.
"""

from __future__ import annotations

import pickle
from typing import Any, Iterable, Mapping

import numpy as np
import torch
import xxhash

_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 array (a view when the tensor is a contiguous CPU
    tensor; GPU and strided tensors are copied first)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_sparse:
        t = t.to_dense()
    t = t.resolve_conj().resolve_neg().contiguous().reshape(-1)
    if t.numel() == 0:
        return np.zeros(0, np.uint8)
    return t.view(torch.uint8).numpy()


def _feed_tensor(hasher: Any, tensor: torch.Tensor) -> None:
    hasher.update(f"T{tuple(tensor.shape)}{tensor.dtype}".encode())
    hasher.update(tensor_bytes(tensor))


def buffers_digest(buffers: Iterable[torch.Tensor]) -> int:
    """Digest of a list of flat buffers (dtype, length and bytes of each, in order)."""
    hasher = xxhash.xxh3_64()
    for buffer in buffers:
        _feed_tensor(hasher, buffer)
    return _signed(hasher.intdigest())


def _key_order(key: Any) -> tuple[str, str]:
    return (type(key).__name__, repr(key))


def _feed(hasher: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        _feed_tensor(hasher, value)
    elif isinstance(value, Mapping):
        hasher.update(f"D{len(value)}".encode())
        for key in sorted(value, key=_key_order):
            _feed(hasher, key)
            _feed(hasher, value[key])
    elif isinstance(value, (list, tuple)):
        hasher.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)}".encode())
        for item in value:
            _feed(hasher, item)
    elif isinstance(value, _PLAIN):
        hasher.update(f"P{type(value).__name__}:{value!r}".encode())
    else:
        try:
            payload = pickle.dumps(value, protocol=4)
        except Exception:  # an object that cannot be pickled is compared by its type only
            payload = repr(type(value)).encode()
        hasher.update(f"O{len(payload)}".encode())
        hasher.update(payload)


def tree_digest(tree: Any) -> int:
    """Canonical digest of a live tree (dicts, lists, tuples, tensors, plain objects)."""
    hasher = xxhash.xxh3_64()
    _feed(hasher, tree)
    return _signed(hasher.intdigest())


def entry_digests(entries: Mapping[str, Any]) -> dict[str, int]:
    """One digest per named entry of a state (`{"model": ..., "optimizer": ..., "epoch": 3}`)."""
    return {name: tree_digest(tree) for name, tree in entries.items()}
