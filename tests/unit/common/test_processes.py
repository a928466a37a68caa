"""The kernel's part in `die_with_parent`, with a real process: the parent-death signal follows
the *thread* that started the process. A process that must outlive a short-lived thread (a pool
host agent's jobs' agents, see `ringmaster/cli/pool_agent.py`) must be started by a thread that
lives as long as it does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from ringmaster.common.processes import dying_with_parent

_WAITS = [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(60)"]


def _start_in(thread_ends: threading.Event, box: dict) -> None:
    proc = subprocess.Popen(dying_with_parent(_WAITS), stdout=subprocess.PIPE, text=True, start_new_session=True)
    box["proc"] = proc
    box["said"] = proc.stdout.readline() if proc.stdout is not None else ""  # its death signal is set by now
    thread_ends.wait(30)


def test_a_process_dies_with_the_thread_that_started_it_not_only_with_its_process() -> None:
    ends, box = threading.Event(), {}
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
