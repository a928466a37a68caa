"""The agent's process helpers, on real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
from harness import wait_for

from ringmaster.common.processes import dying_with_parent

STUCK = textwrap.dedent("""
    import threading
    from ringmaster.common.processes import exit_if_stuck

    exit_if_stuck(0.5)
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # a real deadlock: Python never runs again in this process
""")


def test_a_stuck_stopping_process_exits_and_shows_where_it_was() -> None:
    proc = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=60,
                          start_new_session=True)
    assert proc.returncode == 1
    assert "Timeout" in proc.stderr  # faulthandler's dump
    assert 'File "<string>", line 8' in proc.stderr  # the line it was stuck on


def test_a_process_that_finishes_in_time_keeps_its_exit_code() -> None:
    script = "from ringmaster.common.processes import exit_if_stuck\nexit_if_stuck(30)\nraise SystemExit(3)\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          start_new_session=True)
    assert proc.returncode == 3


PARENT = textwrap.dedent("""
    import signal, subprocess, sys
    from ringmaster.common import processes
    if sys.argv[1] == "fallback":
        processes.shutil.which = lambda name: None
    child = subprocess.Popen(processes.dying_with_parent(["sleep", "60"]))
    print(child.pid, flush=True)
    signal.pause()  # until the test kills this parent
""")


def _gone(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


@pytest.mark.parametrize("how", ["setpriv", "fallback"])
def test_a_command_started_dying_with_parent_dies_with_it(how) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        child = int(parent.stdout.readline())
        wait_for(lambda: open(f"/proc/{child}/cmdline").read().startswith("sleep\0"), 10,
                 "the child to become the command")
        parent.kill()
        parent.wait()
        wait_for(lambda: _gone(child), 10, "the child to die with its parent")
    finally:
        os.killpg(parent.pid, signal.SIGKILL) if parent.poll() is None else None


_WAITS = [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(60)"]


def _start_in(thread_ends: threading.Event, box: dict) -> None:
    proc = subprocess.Popen(dying_with_parent(_WAITS), stdout=subprocess.PIPE, text=True, start_new_session=True)
    box["proc"] = proc
    box["said"] = proc.stdout.readline() if proc.stdout is not None else ""  # its death signal is set by now
    thread_ends.wait(30)


def test_a_process_dies_with_the_thread_that_started_it_not_only_with_its_process() -> None:
    # The kernel's parent-death signal follows the *thread* that started the process: one that
    # must outlive a short-lived thread (a pool host agent's jobs' agents, `cli/pool_agent.py`)
    # is started by a thread that lives as long as it should.
    ends = threading.Event()
    box: dict[str, Any] = {}
    starter = threading.Thread(target=_start_in, args=(ends, box))
    starter.start()
    try:
        while "said" not in box and starter.is_alive():
            starter.join(0.05)
        proc = box["proc"]
        assert box["said"].strip() == "up"
        assert proc.poll() is None  # alive while the thread that started it lives
        ends.set()
        starter.join(30)
        assert proc.wait(30) == -signal.SIGKILL  # this process lives on; its child does not
    finally:
        ends.set()
        if "proc" in box and box["proc"].poll() is None:
            os.killpg(box["proc"].pid, signal.SIGKILL)
            box["proc"].wait()


# A finalizer that needs a lock a daemon thread holds: at the interpreter's finalization that
# thread is frozen, so the finalizer waits forever (as gRPC's call finalizer can in an agent).
HELD_AT_EXIT = textwrap.dedent("""
    import gc, logging, sys, threading
    from ringmaster.common.processes import exit_if_stuck, exit_now

    lock = threading.Lock()

    class Call:
        def __init__(self):
            self.lock = lock

        def __del__(self):
            with self.lock:
                pass

    def hold():
        with lock:
            held.set()
            threading.Event().wait()  # holds the lock until the process ends

    held = threading.Event()
    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    call = Call()
    call.me = call  # garbage in a cycle (as gRPC's calls are), left for the collection at exit
    del call
    gc.disable()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    logging.getLogger("x").info("said before the exit")
    sys.stdout = open(sys.stdout.fileno(), "w", buffering=1 << 16, closefd=False)  # block-buffered
    print("printed before the exit")
    exit_if_stuck(2)  # seconds: the hazard test waits them out
    if sys.argv[1] == "exit_now":
        exit_now(4)
    raise SystemExit(4)
""")


def test_a_finished_daemon_exits_with_its_code_without_finalization_hanging() -> None:
    proc = subprocess.run([sys.executable, "-c", HELD_AT_EXIT, "exit_now"], capture_output=True, text=True,
                          timeout=60, start_new_session=True)
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == "printed before the exit\n" and "said before the exit" in proc.stderr
    assert "Timeout" not in proc.stderr


def test_without_exit_now_such_a_finalizer_hangs_the_exit() -> None:
    """The hazard `exit_now` avoids is real: a plain exit hangs until the watchdog ends it."""
    proc = subprocess.run([sys.executable, "-c", HELD_AT_EXIT, "plain"], capture_output=True, text=True,
                          timeout=60, start_new_session=True)
    assert proc.returncode == 1 and "Timeout" in proc.stderr and "__del__" in proc.stderr
