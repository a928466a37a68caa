"""The agent's process helpers, on real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

STUCK = textwrap.dedent("""
    import threading
    from ringmaster.worker.agent.processes import exit_if_stuck

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
    script = "from ringmaster.worker.agent.processes import exit_if_stuck\nexit_if_stuck(30)\nraise SystemExit(3)\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          start_new_session=True)
    assert proc.returncode == 3
