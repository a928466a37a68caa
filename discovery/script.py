"""Run the user's host discovery script and parse what it prints."""

from __future__ import annotations

from ringmaster.common.bounded_run import MAX_OUTPUT_BYTES, failure_detail, run_bounded
from ringmaster.discovery.errors import DiscoveryError
from ringmaster.discovery.parse import parse_host_lines
from ringmaster.settings import DEFAULT_DISCOVERY_TIMEOUT_S


class ScriptDiscovery:
    """Runs ``path`` (an executable, or any shell command line) and parses its stdout.

    A script that exits non-zero, runs past `timeout_s`, or prints a malformed line raises
    `DiscoveryError` naming the cause (with the tail of its stderr).
    """

    def __init__(self, command: str, default_slots: int | None = None,
                 timeout_s: float = DEFAULT_DISCOVERY_TIMEOUT_S) -> None:
        self.command = command
        self.default_slots = default_slots
        self.timeout_s = timeout_s
        self._last: tuple[bytes, dict[str, int]] | None = None  # the last output parsed, and its hosts

    def describe(self) -> str:
        return f"script {self.command}"

    def find_hosts(self) -> dict[str, int]:
        try:
            outcome, returncode, stdout, stderr = run_bounded(self.command, self.timeout_s)
        except OSError as exc:
            raise DiscoveryError(f"host discovery script {self.command!r} could not be started: {exc}") from None
        if outcome == "timeout":
            raise DiscoveryError(
                f"host discovery script {self.command!r} did not finish within {self.timeout_s:g} s; "
                "make it return faster (it runs every --discovery-interval)"
            )
        if outcome == "too-much":
            raise DiscoveryError(
                f"host discovery script {self.command!r} printed more than {MAX_OUTPUT_BYTES} bytes; "
                "it should print one 'host:slots' line per host"
            )
        if returncode != 0:
            raise DiscoveryError(f"host discovery script {self.command!r} exited with code {returncode}"
                                 f"{failure_detail(self.command, returncode or 0, stderr)}")
        if self._last is not None and self._last[0] == stdout:
            # (what it printed last time: parsing 4,096 lines every --discovery-interval was 5% of
            # a large job's rendezvous, on a thread that holds the interpreter's lock)
            return dict(self._last[1])
        hosts = parse_host_lines(stdout.decode(errors="replace"), self.default_slots,
                                 source=f"host discovery script {self.command!r}")
        self._last = (stdout, hosts)
        return dict(hosts)
