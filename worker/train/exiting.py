"""How a worker process ends: promptly, with its status, skipping the interpreter's teardown.

The interpreter's teardown of torch's native objects (Gloo groups, their threads, the CUDA
context) takes 0.4 s for a bare `import torch` here and was measured at 5 s for a retired
worker, holding the CPU its host's new workers waited for. A worker that crashed matters more:
the next ring waits for its exit status (`exit_report_timeout_s`) to know whether its host is
blacklisted, and a teardown slower than that (a loaded machine) cost a second reset. So a worker
sent away (`leave`) or whose script raised (the hook `install_crash_hook` sets) ends in
`exit_promptly`, the last exit handler, after the script's own handlers and a flush of every
open file. A worker that finishes training, or is interrupted (Ctrl-C), exits as Python does,
with the status only the interpreter knows, but its script's globals are dropped (each `__del__`
run) in the last exit handler and the rest of the heap is left to the OS
(`ringmaster.common.processes.leave_the_heap_to_the_os`): that teardown was 1.4 s of the 1.6 s
between two workers returning from training and their exit, measured with py-spy.
"""

from __future__ import annotations

import os
import sys
import types
from types import TracebackType
from typing import Callable

from ringmaster.common.errors import JobFatalError
from ringmaster.common.processes import flush_open_files, leave_the_heap_to_the_os

#: The exit status of a worker the rendezvous sent away (see `leave`); None while it trains.
leaving_code: int | None = None
#: Whether the script ended by an uncaught exception (set by the hook `install_crash_hook` sets).
crashed = False
#: The status Python gives a script that ended by an uncaught exception.
CRASH_CODE = 1
#: Tells the rendezvous that the job cannot go on (set by the worker's context once it has a
#: rendezvous): called with the message of an uncaught `JobFatalError`, after it is printed.
fatal_reporter: Callable[[str], None] | None = None

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
        shown = hook(kind, value, tb)
        if issubclass(kind, JobFatalError) and fatal_reporter is not None:
            try:
                fatal_reporter(str(value))
            except Exception:  # noqa: BLE001 (the rendezvous is away: the exit status still tells)
                pass
        return shown

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
        finalize_the_script()
        leave_the_heap_to_the_os()
        return
    flush_open_files()
    os._exit(code)


def finalize_the_script() -> None:
    """Drop what the script made, as the interpreter's teardown would have, so that each object's
    `__del__` runs while every module is still there to use. Only the script's objects go, the
    newest first; its modules, functions and classes stay, as a finalizer may call them (a
    `__del__` that writes with `sys`, or calls a helper of the script, works as in plain Python)."""
    main = sys.modules.get("__main__")
    if main is None:
        return
    names = [name for name, value in vars(main).items()
             if not (name.startswith("__") and name.endswith("__")) and not isinstance(value, _KEPT_TYPES)]
    for name in reversed(names):
        try:
            delattr(main, name)
        except Exception:  # noqa: BLE001 (a finalizer's error is printed and ignored, as in the teardown)
            pass


_KEPT_TYPES = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)
