"""The agent's word on its workers' processes: `/proc/PID/stat` parsed, and real processes
(a busy loop, a sleeper, a stopped one, a zombie) told apart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from harness import wait_for

from ringmaster.worker.agent.process_watch import ProcessSample, ProcessWatch, is_busy, parse_stat, read_stat


def test_a_stat_line_is_parsed_whatever_the_name_holds() -> None:
    line = "4242 (py thon) (x)) R 1 4242 4242 0 -1 4194560 900 0 0 0 170 30 0 0 20 0 3 0 100 0 0"
    assert parse_stat(line) == ProcessSample("R", 200)
    assert parse_stat("garbage") is None and parse_stat("1 (x) S 1") is None


@pytest.mark.parametrize("state, before, after, busy", [
    ("R", None, 0, True), ("D", 5, 5, True),  # running, or reading the disk (an import)
    ("S", 5, 9, True), ("S", 5, 5, False), ("S", None, 9, False),  # asleep: busy only if it used CPU since
    ("T", 5, 9, False), ("t", 5, 9, False), ("Z", 5, 9, False),  # stopped, traced, zombie
])
def test_busy_is_running_or_using_cpu_and_never_stopped_or_dead(state, before, after, busy) -> None:
    previous = ProcessSample("S", before) if before is not None else None
    assert is_busy(ProcessSample(state, after), previous) is busy
    assert not is_busy(None, previous)


def test_real_processes_are_told_apart() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    ended = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        watch = ProcessWatch()
        workers = [("spin", spin.pid), ("sleeper", sleeper.pid), ("ended", ended.pid), ("gone", 2 ** 22 + 7)]
        wait_for(lambda: read_stat(ended.pid) is not None and read_stat(ended.pid).state == "Z", 30, "a zombie")
        wait_for(lambda: read_stat(sleeper.pid) is not None and read_stat(sleeper.pid).state == "S", 30, "a sleeper")
        watch.busy(workers)
        assert wait_for(lambda: watch.busy(workers) == ["spin"], 10, "only the busy loop busy")
        os.kill(spin.pid, signal.SIGSTOP)
        wait_for(lambda: read_stat(spin.pid).state == "T", 10, "the loop stopped")  # type: ignore[union-attr]
        assert watch.busy(workers) == []
    finally:
        for proc in (spin, sleeper, ended):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
