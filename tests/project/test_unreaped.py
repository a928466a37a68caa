"""The suite's own check that every process a test starts is waited for (tests/unreaped.py, run
after every test's teardown by conftest.py) finds a child left unwaited, names it and reaps it."""

from __future__ import annotations

import subprocess
import time

import psutil
from unreaped import children, unreaped_since


def test_a_child_left_unwaited_is_named_and_reaped_and_a_waited_one_is_not() -> None:
    before = children()
    waited = subprocess.Popen(["true"])
    waited.wait()
    left = subprocess.Popen(["true"])  # (never waited for here: the check must find it)
    deadline = time.monotonic() + 30
    while psutil.Process(left.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "`true` did not exit within 30 s"
        time.sleep(0.01)
    found = unreaped_since(before)
    assert found == [f"pid {left.pid} (true)"]
    assert not psutil.pid_exists(left.pid) or psutil.Process(left.pid).ppid() != psutil.Process().pid
    assert unreaped_since(before) == []
    left.returncode = 0  # (reaped by the check: its Popen must not wait again)
