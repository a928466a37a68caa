"""In-memory commits: a snapshot of state that survives the state being changed or broken.

Tensors are copied to host memory (a snapshot never doubles GPU memory), everything else is
deep-copied. Restoring copies back in place, so references held by the optimizer or by user
code stay valid.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


def snapshot(value: Any) -> Any:
    """A detached host-memory copy of `value` (tensors, and containers of them, and objects)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snapshot(v) for v in value]
    if isinstance(value, tuple):
        return tuple(snapshot(v) for v in value)
    return copy.deepcopy(value)


def restore_state_dict(target: dict[str, Any], saved: dict[str, Any]) -> None:
    """Copy `saved` tensors into `target`'s tensors in place where shapes agree."""
    for key, value in saved.items():
        current = target.get(key)
        if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor) and current.shape == value.shape:
            with torch.no_grad():
                current.copy_(value)
        else:
            target[key] = snapshot(value)
