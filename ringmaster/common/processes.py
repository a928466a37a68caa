"""Small helpers for the processes Ringmaster starts."""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import gc
import io
import logging
import os
import shutil
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies, so nothing is orphaned.

    Called in the process itself (an agent at start-up) or in a child before exec (a worker).
    Linux only; elsewhere a no-op. If the parent is already gone, exit at once. The kernel sends
    the signal when the parent *thread* that started this process ends, not only its process:
    start such a process from a thread that lives as long as it should (the main thread).
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def exit_if_stuck(bound_s: float) -> None:
    """Make this process exit (code 1) if it is still alive `bound_s` seconds from now.

    For a daemon that has begun to stop: a library deadlocked in a thread (gRPC can deadlock
    while closing a channel) must not keep a host's agent, and the job waiting on it, alive
    forever. faulthandler's watchdog is a C thread that needs no GIL, so it fires even when
    Python is stuck; it prints every thread's stack first, so the hang shows where it was.
    """
    faulthandler.dump_traceback_later(bound_s, exit=True)


def skip_teardown_at_exit() -> None:
    """End this process, once its exit handlers have run, without the interpreter's teardown of
    its modules (registered as an exit handler, so it runs after those registered later;
    idempotent). For a `ringmaster` command: its exit is the end of the job for whoever waits on
    it, and nothing it holds needs finalizing (see `leave_the_heap_to_the_os`)."""
    atexit.unregister(leave_the_heap_to_the_os)
    atexit.register(leave_the_heap_to_the_os)


def leave_the_heap_to_the_os() -> None:
    """Flush every open file, then freeze the heap (`gc.freeze()`): the interpreter's finalization
    then neither collects nor tears down what is alive, and the OS takes it back at once.

    With torch imported (a rendezvous imports it for its TCPStore, a worker trains with it) that
    teardown frees 250,000 objects: 1.0 s of CPU for a bare `import torch`, 1.4 s for each of two
    workers returning from training together on 2 cores (py-spy: `gc_collect_main`), after the
    job's work was done and while the job's end, or the next job, waited for that CPU. Python's
    exit is otherwise unchanged: the exit status, the exit handlers, the standard streams flushed.
    What is skipped is what Python never promised: `__del__` of objects alive at exit.
    """
    flush_open_files()
    gc.freeze()


def exit_now(code: int) -> None:
    """Flush what was said, then end this process with `code`, skipping the interpreter's
    finalization.

    For a daemon whose work is done (workers stopped, channels closed): at finalization its
    daemon threads (a gRPC stream reader, gRPC's own channel thread) are frozen wherever they
    were, maybe holding a call's lock, and the finalizer of that call (`grpc._channel`'s
    `__del__`) then waits for the lock forever (seen: an agent hung 30 s at exit until
    `exit_if_stuck` ended it with code 1). Nothing left needs finalizing.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing more can be said on it
    os._exit(code)


#: Sets PR_SET_PDEATHSIG, exits if the parent died meanwhile, then becomes the command (for
#: machines without setpriv(1)).
_EXEC_WITH_PARENT_DEATH = (
    "import ctypes, os, sys; ctypes.CDLL('libc.so.6').prctl(1, 9); "
    "os.getppid() == int(sys.argv[1]) or os._exit(1); os.execvp(sys.argv[2], sys.argv[2:])"
)


def dying_with_parent(argv: list[str]) -> list[str]:
    """`argv` made to die (SIGKILL) with the process that starts it, without `preexec_fn`.

    subprocess' `preexec_fn` runs Python in the child between fork and exec; in a process with
    gRPC's threads that can crash the child before it ever runs (seen: SIGSEGV in the child's
    after-fork handlers, reported as a worker killed by signal 11). setpriv(1) (util-linux) sets
    the death signal and execs the command instead, keeping its pid; without it, a minimal
    isolated Python does the same. As with `die_with_parent`, the starting *thread*'s end kills it.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        return [setpriv, "--pdeathsig", "KILL", "--", *argv]
    return [sys.executable, "-I", "-S", "-c", _EXEC_WITH_PARENT_DEATH, str(os.getpid()), *argv]


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
