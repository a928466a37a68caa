"""Does a saved state fit the live one? A pure comparison of two state trees, so a checkpoint
written by another model is named with what differs instead of failing deep inside
`load_state_dict` (or, worse, loading into tensors of another shape).

Only structure is compared: the keys of dicts of tensors (a module's state dict), the length
of lists of tensors and of an optimizer's parameter lists, and the shape and dtype of every
tensor present in both. Plain values (an epoch
counter, a learning rate) may differ: that is what a checkpoint is for.
"""

from __future__ import annotations

from typing import Any

import torch

from ringmaster.checkpoint.tree import flatten

#: Differences reported at most (the first ones say enough).
MAX_DIFFERENCES = 6


def differences(saved: Any, live: Any, path: str = "") -> list[str]:
    """Human-readable structural differences between `saved` and `live`, at most MAX_DIFFERENCES."""
    found: list[str] = []
    _walk(saved, live, path, found)
    return found[:MAX_DIFFERENCES]


def _walk(saved: Any, live: Any, path: str, found: list[str]) -> None:
    if len(found) >= MAX_DIFFERENCES:
        return
    where = path or "(the whole state)"
    if isinstance(live, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            found.append(f"{where} is a tensor here but {type(saved).__name__} in the checkpoint")
        elif tuple(saved.shape) != tuple(live.shape) or saved.dtype != live.dtype:
            found.append(f"{where} has shape {list(saved.shape)} {_dtype(saved)} in the checkpoint "
                         f"and {list(live.shape)} {_dtype(live)} here")
        return
    if isinstance(live, dict):
        if not isinstance(saved, dict):
            found.append(f"{where} is a dict here but {type(saved).__name__} in the checkpoint")
            return
        if _flat_state_dict(live) or _flat_state_dict(saved):  # a module's: every key must match
            missing = [k for k in live if k not in saved]
            extra = [k for k in saved if k not in live]
            if missing:
                found.append(f"{where} lacks {_names(missing)} in the checkpoint")
            if extra:
                found.append(f"{where} has {_names(extra)} in the checkpoint that this model does not")
        for key in live:
            if key in saved:
                _walk(saved[key], live[key], f"{path}.{key}" if path else str(key), found)
        return
    if isinstance(live, (list, tuple)):
        if not isinstance(saved, (list, tuple)):
            found.append(f"{where} is a list here but {type(saved).__name__} in the checkpoint")
        elif len(saved) != len(live) and (_holds_tensors(live) or _holds_tensors(saved)
                                          or path.endswith(("param_groups", "params"))):
            found.append(f"{where} has {len(saved)} entries in the checkpoint and {len(live)} here")
        else:
            for index, (s, v) in enumerate(zip(saved, live)):
                _walk(s, v, f"{path}[{index}]", found)


def _flat_state_dict(tree: dict) -> bool:
    """A dict whose values are tensors (a module's state dict, one parameter's optimizer state);
    not the optimizer's `state`, which fills in lazily, one entry per parameter stepped."""
    return any(isinstance(v, torch.Tensor) for v in tree.values())


def _holds_tensors(tree: Any) -> bool:
    return bool(flatten(tree)[1])


def _names(keys: list) -> str:
    shown = ", ".join(repr(k) for k in keys[:4])
    return shown + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")
