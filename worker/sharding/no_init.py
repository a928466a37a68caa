"""Building a model whose every value a commit will overwrite, without initializing it first.

After a reset a `ShardedState` builds the model again on the new generation's mesh and loads
the committed shards into it: every parameter and persistent buffer (the module's state dict)
is overwritten. Initializing them first is wasted work on the recovery's critical path: for a
21 M-parameter transformer `torch.nn.init` takes 0.11 s of the 0.13 s its construction takes on
one thread here (`bench/sharded.py`'s model). `ShardedState` first builds on the meta device and
gives the modules memory afterwards (`sharded_state._built_empty`, as TorchTitan does); what that
cannot rebuild (a non-persistent buffer, a tensor kept outside the modules' parameters and
buffers, a build that needs real values) is built here instead: `torch.nn.init`'s in-place
initializers leave their tensor as it is while `skipped()` is in force (the tensor holds whatever
its allocation held until the commit is copied in).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch.nn.init as init

#: torch.nn.init's in-place initializers: what modules' `reset_parameters` call.
INITIALIZERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
                "sparse_")

_lock = threading.Lock()


def _left_as_it_is(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


@contextlib.contextmanager
def skipped() -> Iterator[None]:
    """Within it, torch.nn.init's initializers do nothing (module-wide: other threads too, so
    only for a build whose every parameter and persistent buffer is then loaded)."""
    with _lock:
        saved = {name: getattr(init, name) for name in INITIALIZERS if hasattr(init, name)}
        try:
            for name in saved:
                setattr(init, name, _left_as_it_is)
            yield
        finally:
            for name, function in saved.items():
                setattr(init, name, function)
