"""`in_thread`, which Horovod's `common.py` imports from `horovod.runner.util.threads` (the one
line changed in that file). Ringmaster's own code, not Horovod's: a daemon thread started at once."""

from __future__ import annotations

import threading
from typing import Any, Callable


def in_thread(target: Callable[..., Any], args: tuple = (), name: str | None = None, daemon: bool = True,
              silent: bool = False) -> threading.Thread:
    """Start `target(*args)` on a thread and return the thread (Horovod's signature; `silent` is
    accepted for it: an exception is printed by the thread, as any thread's is)."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread
