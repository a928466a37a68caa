"""How a worker process ends: a crash (an uncaught exception after `hvd.init()`) ends it at once
with Python's status and its files flushed, skipping the interpreter's teardown; a script that
returns, or is interrupted, exits as Python does, only without the collector's passes over the
heap. Real interpreters, each a job of one."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from ringmaster.worker.train.context import WorkerContext

SCRIPT = textwrap.dedent("""
    import atexit, sys
    import ringmaster.torch as hvd

    class Finalized:
        def __del__(self):
            sys.stderr.write("torn down\\n")  # runs only in the interpreter's teardown

    class InACycle:
        def __del__(self):
            sys.stderr.write("collected at exit\\n")  # found only by a collection of the whole heap

    class UsesTheScript:
        def __del__(self):
            sys.stderr.write(f"finalized with {helper()}\\n")  # a global of the script, at exit

    def helper():
        return "the script's helper"

    keep = Finalized()
    uses = UsesTheScript()
    cycle = InACycle()
    cycle.me = cycle
    del cycle  # garbage that only the collector frees
    hvd.init()
    log = open(sys.argv[1], "w")
    log.write("last line, never flushed by the script")
    atexit.register(lambda: sys.stderr.write("script's exit handler\\n"))
    how = sys.argv[2]
    if how == "raise":
        raise RuntimeError("the training script failed")
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "exit":
        sys.exit(3)
""")


def _run(tmp_path: Path, how: str) -> tuple[int, str, str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    log = tmp_path / "log.txt"
    done = subprocess.run([sys.executable, str(script), str(log), how], capture_output=True, text=True,
                          timeout=120, start_new_session=True)
    return done.returncode, done.stderr, log.read_text() if log.exists() else ""


def test_a_crashed_worker_exits_at_once_with_status_1_its_files_flushed(tmp_path: Path) -> None:
    code, stderr, log = _run(tmp_path, "raise")
    assert code == 1, stderr
    assert "RuntimeError: the training script failed" in stderr  # the traceback, printed as before
    assert "script's exit handler" in stderr
    assert log == "last line, never flushed by the script"
    assert "torn down" not in stderr  # the teardown was skipped


def test_a_worker_that_ends_its_script_exits_as_python_does_without_tearing_down_the_heap(tmp_path: Path) -> None:
    code, stderr, log = _run(tmp_path, "exit")  # (a script that returns takes the same path, with status 0)
    assert code == 3, stderr
    assert "script's exit handler" in stderr
    assert "torn down" in stderr  # the script's globals were finalized
    assert "finalized with the script's helper" in stderr  # while its modules and functions were still there
    assert log == "last line, never flushed by the script"
    assert "collected at exit" not in stderr  # but the heap was left to the OS, not collected (gc.freeze)


def test_an_interrupted_worker_ends_by_sigint_as_python_does(tmp_path: Path) -> None:
    code, stderr, _ = _run(tmp_path, "interrupt")
    assert code == -signal.SIGINT, stderr


def test_a_leaving_worker_closes_its_session_before_its_ring() -> None:
    """The order inside `WorkerContext.shutdown`, with stand-ins for the session and the ring: the
    race it prevents (the peers' "connection closed by peer" reaching the rendezvous before the
    crashed worker's closed session, so the next ring includes the dying worker) cannot be made
    to happen on demand with real processes."""
    order: list[str] = []

    class Session:
        def close(self) -> None:
            order.append("session closed")

    class Ring:
        idle = True

        def close(self, reason: str) -> None:
            order.append("queue closed")

        def abort(self) -> None:
            order.append("ring torn down")

    context = WorkerContext(environ={})
    context.link, context.comm = Session(), Ring()  # type: ignore[assignment]
    context.shutdown()
    assert order == ["session closed", "queue closed", "ring torn down"]
