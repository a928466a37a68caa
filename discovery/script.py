"""Run the user's host discovery script and parse what it prints."""

from __future__ import annotations

import os
import signal
import subprocess

from discovery.errors import DiscoveryError
from discovery.parse import parse_host_lines

#: Seconds a discovery script may run before it is killed and the attempt counts as failed.
DEFAULT_SCRIPT_TIMEOUT_S = 10.0


class ScriptDiscovery:
    """Runs ``path`` (an executable, or any shell command line) and parses its stdout.

    A script that exits non-zero, runs past `timeout_s`, or prints a malformed line raises
    `DiscoveryError` naming the cause (with the tail of its stderr).
    """

    def __init__(self, command: str, default_slots: int | None = None, timeout_s: float = DEFAULT_SCRIPT_TIMEOUT_S) -> None:
        self.command = command
        self.default_slots = default_slots
        self.timeout_s = timeout_s

    def describe(self) -> str:
        return f"script {self.command}"

    def find_hosts(self) -> dict[str, int]:
        try:
            proc = subprocess.Popen(
                self.command,
                shell=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # so a timeout kills the script's children too
            )
        except OSError as exc:
            raise DiscoveryError(f"host discovery script {self.command!r} could not be started: {exc}") from None
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            raise DiscoveryError(
                f"host discovery script {self.command!r} did not finish within {self.timeout_s:g} s; "
                "make it return faster (it runs every --discovery-interval)"
            ) from None
        if proc.returncode != 0:
            tail = stderr.strip().splitlines()[-3:]
            detail = f": {' | '.join(tail)}" if tail else ""
            raise DiscoveryError(
                f"host discovery script {self.command!r} exited with code {proc.returncode}{detail}"
            )
        return parse_host_lines(stdout, self.default_slots, source=f"host discovery script {self.command!r}")


def _kill_group(pid: int) -> None:
    """Kill the script and everything it started (it leads its own process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
