"""What a red test says about itself: the stacks of every process it started when it runs out
of time, and the story and output tail of each job it ran when it fails.

pytest-timeout ends a hung test after its limit with the test's own stack only; the process that
was stuck is usually another one (a worker in a ring, an agent, the rendezvous). So a watchdog
fires `STACKS_BEFORE_S` before the limit, dumps the Python stacks of the test process' whole
process tree with py-spy (every thread; native frames left out), and the report carries them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from typing import Iterable

import psutil

#: Seconds before a test's time limit at which the stacks are taken.
STACKS_BEFORE_S = 5.0
#: Seconds one py-spy dump may take, and how many processes are dumped at most.
DUMP_TIMEOUT_S = 10.0
MAX_DUMPED = 40
#: Lines of each job's output in a failed test's report.
OUTPUT_TAIL_LINES = 60


def py_spy() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.path.exists(here) else shutil.which("py-spy")


def process_tree(root: int) -> list[psutil.Process]:
    try:
        return psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []


def dump_stacks(pids: Iterable[int]) -> str:
    """The Python stacks of `pids` (py-spy), or why none could be had."""
    tool = py_spy()
    if tool is None:
        return "(py-spy is not installed: no stacks of the test's processes)"
    out = []
    for pid in list(pids)[:MAX_DUMPED]:
        try:
            name = " ".join(psutil.Process(pid).cmdline())[:200]
        except psutil.Error:
            continue
        try:
            done = subprocess.run([tool, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                  timeout=DUMP_TIMEOUT_S)
            text = done.stdout.strip() or done.stderr.strip()
        except subprocess.TimeoutExpired:
            text = f"(py-spy took over {DUMP_TIMEOUT_S:g} s)"
        out.append(f"--- pid {pid}: {name}\n{text}")
    return "\n".join(out) or "(the test had no child processes left)"


class Watchdog:
    """Takes the stacks of the test process' children shortly before the test's time limit."""

    def __init__(self, limit_s: float) -> None:
        self.stacks: str | None = None
        self._timer = threading.Timer(max(0.5, limit_s - STACKS_BEFORE_S), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.stacks = dump_stacks(p.pid for p in process_tree(os.getpid()))

    def cancel(self) -> None:
        self._timer.cancel()


def job_sections(jobs) -> list[tuple[str, str]]:
    """(title, text) per job a failed test ran: its rings' story and the tail of its output."""
    sections = []
    for number, job in enumerate(jobs):
        tail = "\n".join(job.lines[-OUTPUT_TAIL_LINES:])
        sections.append((f"job {number} ({job.verb}, exit {job.proc.poll()})",
                         f"{job.story()}\n--- last {OUTPUT_TAIL_LINES} lines:\n{tail}"))
    return sections
