"""An agent (or its ssh) that ends before it connected is reported with the last lines it printed.

The process is real (`sh`), and so are the relay threads that copy its output; the sink they copy
to is slow on purpose (2 ms a line, as a slow terminal or a full pipe to a log collector is), so
the relays are still copying when the process is already gone: the moment at which a launcher
that looked only at the exit said "(it printed nothing)" for an ssh that had said
"Connection refused".
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import time
from typing import Iterator

import pytest
from harness import wait_for

from ringmaster.launch.launchers import RELAY_DRAIN_S, AgentOptions, LocalLauncher, _Launched, _relay_thread

REFUSED = "ssh: connect to host hostC port 22: Connection refused"


class SlowSink(io.StringIO):
    """Takes 2 ms for each line written to it."""

    def write(self, text: str) -> int:
        time.sleep(0.002)  # the simulated cost of a slow consumer, not a wait for something
        return super().write(text)


@pytest.fixture
def launched_shell() -> Iterator:
    """Start `sh -c SCRIPT` as ssh would be started for hostC (its own process group, killed in
    teardown), relayed into a `SlowSink`, and hand back the launcher that watches it."""
    procs: list[subprocess.Popen] = []

    def start(script: str) -> LocalLauncher:
        launcher = LocalLauncher(AgentOptions("127.0.0.1:1", 1.0, 5.0), secret=None)
        proc = subprocess.Popen(["sh", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(proc)
        launched = _Launched(proc, remote=True, via="ssh")
        launched.relays = [_relay_thread(proc.stdout, SlowSink(), launched.output)]
        launcher.agents["hostC"] = launched
        return launcher

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_ended(launcher: LocalLauncher, deadline_s: float) -> list[tuple[str, str]]:
    return wait_for(launcher.ended, deadline_s, "the launcher to report hostC's end", interval_s=0.001)


def test_an_ssh_that_exits_at_once_is_reported_with_what_it_printed_last(launched_shell) -> None:
    launcher = launched_shell(f"for i in $(seq 200); do echo warning $i; done; echo '{REFUSED}' >&2; exit 255")
    [(host, how)] = wait_ended(launcher, 20)
    assert host == "hostC"
    assert "ssh exited with code 255 before the agent connected" in how and REFUSED in how, how
    assert launcher.alive() == 0 and launcher.ended() == []  # reported once


def test_a_child_holding_the_pipe_open_does_not_hold_the_report_back(launched_shell) -> None:
    """The exit is reported at most `RELAY_DRAIN_S` after it was seen, even while a child of the
    process keeps the output pipe open (the relay never reaches its end)."""
    launcher = launched_shell(f"sleep 60 & echo '{REFUSED}'; exit 255")
    relay = launcher.agents["hostC"].relays[0]
    [(_, how)] = wait_ended(launcher, RELAY_DRAIN_S + 10)
    assert REFUSED in how and "code 255" in how
    assert relay.is_alive()  # the pipe is still open: the report came from the bound, not the pipe's end
    assert launcher.agents == {}
