"""Small helpers for the processes Ringmaster starts."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies, so nothing is orphaned.

    Called in the process itself (an agent at start-up) or in a child before exec (a worker).
    Linux only; elsewhere a no-op. If the parent is already gone, exit at once.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)
