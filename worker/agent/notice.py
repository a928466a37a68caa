"""Preemption notices: the agent's `--preemption-notice-script`, run every `--notice-interval`.

Clouds warn before they take a machine (AWS: instance metadata `spot/instance-action`, two
minutes ahead; GCP: `instance/preempted`, 30 s), and so do Slurm (`--signal`) and operators. The
script turns whatever the platform says into one line: nothing (exit 0) means no notice;
`drain SECONDS` means this host goes away in that many seconds. `deploy/notice/` has scripts
for AWS and GCP. A notice drains the host (its workers leave at their next commit); a notice
that disappears again is withdrawn and the host may be used again.

The script is untrusted input like discovery's: bounded in time and output, its group killed,
and anything else it prints is reported, never acted on.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable

from ringmaster.common.bounded_run import failure_detail, run_bounded

#: Most bytes read from one run of a notice script (it prints at most one short line).
MAX_NOTICE_BYTES = 4096
#: The longest notice taken (a day); a farther one is no notice worth draining for yet.
MAX_NOTICE_S = 86_400.0


def parse_notice(stdout: bytes) -> tuple[float | None, str]:
    """(seconds until the host goes, or None for no notice; "" or what is wrong with the output)."""
    lines = [line.strip() for line in stdout.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        return None, ""
    if len(lines) > 1:
        return None, f"printed {len(lines)} lines; print one line, `drain SECONDS`, or nothing"
    words = lines[0].split()
    if len(words) != 2 or words[0] != "drain":
        return None, f"printed {lines[0][:80]!r}; print `drain SECONDS`, or nothing for no notice"
    try:
        seconds = float(words[1])
    except ValueError:
        return None, f"printed {lines[0][:80]!r}: {words[1][:20]!r} is not a number of seconds"
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_NOTICE_S:
        return None, f"printed {lines[0][:80]!r}: the seconds must be between 0 and {MAX_NOTICE_S:g}"
    return seconds, ""


class NoticeWatcher:
    """Runs the script every `interval_s` on its own thread and calls `on_notice(seconds)` when
    a notice appears or its time changes, `on_notice(None)` when it is withdrawn, and
    `on_problem(text)` when the script misbehaves (once per distinct problem)."""

    def __init__(self, script: str, interval_s: float, on_notice: Callable[[float | None], None],
                 on_problem: Callable[[str], None], stop: threading.Event, env: dict[str, str] | None = None) -> None:
        self.script = script
        self.interval_s = interval_s
        self.timeout_s = max(1.0, min(2 * interval_s, 30.0))
        self.env = env
        self._on_notice = on_notice
        self._on_problem = on_problem
        self._stop = stop
        self._current: float | None = None  # the deadline last given (an absolute time), None: no notice
        self._problem = ""
        self.thread = threading.Thread(target=self._run, name="notice-watcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def check(self, now: float) -> None:
        """Run the script once and act on what it says (`now`: monotonic seconds)."""
        seconds, problem = self._ask()
        if problem:
            if problem != self._problem:
                self._on_problem(problem)
            self._problem = problem
            return  # a failing script says nothing either way: the last notice stands
        self._problem = ""
        if seconds is None:
            if self._current is not None:
                self._current = None
                self._on_notice(None)
            return
        deadline = now + seconds
        if self._current is None or abs(deadline - self._current) > max(1.0, self.interval_s):
            self._current = deadline
            self._on_notice(seconds)

    def _ask(self) -> tuple[float | None, str]:
        try:
            outcome, code, out, err = run_bounded(self.script, self.timeout_s, MAX_NOTICE_BYTES, self.env)
        except OSError as exc:
            return None, f"{self.script!r} could not be started: {exc}"
        if outcome == "timeout":
            return None, f"{self.script!r} did not finish within {self.timeout_s:g} s"
        if outcome == "too-much":
            return None, f"{self.script!r} printed more than {MAX_NOTICE_BYTES} bytes"
        if code != 0:
            return None, f"{self.script!r} exited with code {code}{failure_detail(self.script, code or 0, err)}"
        return parse_notice(out)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.check(time.monotonic())
            self._stop.wait(self.interval_s)
