"""How a worker process ends: promptly, with its status, skipping the interpreter's teardown.

The interpreter's teardown of torch's native objects (Gloo groups, their threads, the CUDA
context) takes 0.4 s for a bare `import torch` here and was measured at 5 s for a retired
worker, holding the CPU its host's new workers waited for. A worker that crashed matters more:
the next ring waits for its exit status (`exit_report_timeout_s`) to know whether its host is
blacklisted, and a teardown slower than that (a loaded machine) cost a second reset. So a worker
sent away (`leave`) or whose script raised (the hook `install_crash_hook` sets) ends in
`exit_promptly`, the last exit handler, after the script's own handlers and a flush of every
open file. A worker that finishes training, or is interrupted (Ctrl-C), exits as Python does.
"""

from __future__ import annotations

import gc
import io
import os
import sys
from types import TracebackType
from typing import Callable

#: The exit status of a worker the rendezvous sent away (see `leave`); None while it trains.
leaving_code: int | None = None
#: Whether the script ended by an uncaught exception (set by the hook `install_crash_hook` sets).
crashed = False
#: The status Python gives a script that ended by an uncaught exception.
CRASH_CODE = 1

Hook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


def leave(code: int) -> None:
    """Leave the job: SystemExit(code) goes up through the training script (its `finally` blocks
    and exit handlers run), and `exit_promptly`, the last exit handler, then ends the process."""
    global leaving_code
    leaving_code = code
    raise SystemExit(code) from None


def install_crash_hook() -> None:
    """Note an uncaught exception (then print it as before) so that `exit_promptly` ends the
    process with Python's status for it. Idempotent; a hook the script sets later replaces it
    (the process then exits as Python does, only later)."""
    current = sys.excepthook
    if getattr(current, "_notes_crashes", False):
        return
    sys.excepthook = _noting_crashes(current)


def _noting_crashes(hook: Hook) -> Hook:
    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> object:
        global crashed
        crashed = not issubclass(kind, KeyboardInterrupt)  # Python ends those by SIGINT: left to it
        return hook(kind, value, tb)

    excepthook._notes_crashes = True  # type: ignore[attr-defined]
    return excepthook


def exit_code() -> int | None:
    """The status to end with at once, or None: exit as Python does."""
    if leaving_code is not None:
        return leaving_code
    return CRASH_CODE if crashed else None


def exit_promptly() -> None:
    """Registered at exit before anything else, so it runs after the script's exit handlers."""
    code = exit_code()
    if code is None:
        return
    flush_open_files()
    os._exit(code)


def flush_open_files() -> None:
    """Flush every open writable Python file, as the interpreter's teardown would have (a log the
    script wrote without closing keeps its last lines); errors are ignored, as there."""
    files = [obj for obj in gc.get_objects() if type(obj) in _FILE_TYPES]
    files.sort(key=lambda f: not isinstance(f, io.TextIOWrapper))  # text first: it flushes into its buffer
    for stream in [sys.stdout, sys.stderr, *files]:
        try:
            if not stream.closed and stream.writable():
                stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


_FILE_TYPES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
