"""Every process a test starts is waited for: a child of the test's process that exited during the
test and is still a zombie once the test's fixtures have torn down was never waited for (a
`Popen` killed and dropped, a fork without `waitpid`). Such a test fails, naming the processes,
and they are reaped here, so that one test's leak never shows as another's. A zombie stays one
until its parent waits, so the check needs no grace: by teardown the test's own waits are done."""

from __future__ import annotations

import os

import psutil


def children() -> set[int]:
    """The pids of this process' children now."""
    return {child.pid for child in psutil.Process().children()}


def unreaped_since(before: set[int]) -> list[str]:
    """The zombie children that were not children at `before`, reaped now: one line each."""
    found = []
    for child in psutil.Process().children():
        if child.pid in before:
            continue
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                continue
            name = child.name()
        except psutil.Error:
            continue
        try:
            os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            continue  # (waited for meanwhile, by its Popen)
        found.append(f"pid {child.pid} ({name})")
    return found
