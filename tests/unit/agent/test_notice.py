"""Preemption notice scripts: what they print is parsed strictly, and a misbehaving one is
bounded and reported, never acted on (real scripts, run as the agent runs them)."""

from __future__ import annotations

import threading

import pytest

from ringmaster.worker.agent.notice import NoticeWatcher, parse_notice


@pytest.mark.parametrize("out, seconds, problem", [
    (b"", None, ""), (b"\n  \n", None, ""), (b"drain 120\n", 120.0, ""), (b"  drain 0.5  ", 0.5, ""),
    (b"drain\n", None, "print `drain SECONDS`"), (b"drain soon\n", None, "is not a number"),
    (b"drain -3\n", None, "between 0 and"), (b"drain nan\n", None, "between 0 and"), (b"drain 1e9\n", None,
                                                                                      "between 0 and"),
    (b"terminate 30\n", None, "print `drain SECONDS`"), (b"drain 10\ndrain 20\n", None, "printed 2 lines"),
    (b"\xff\xfe drain 10", None, "print `drain SECONDS`"),
])
def test_a_notice_is_one_line_or_nothing(out, seconds, problem) -> None:
    got, said = parse_notice(out)
    assert got == seconds
    assert (problem in said) if problem else said == ""


def watcher(tmp_path, body: str, interval_s: float = 0.5):
    script = tmp_path / "notice.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    notices: list[float | None] = []
    problems: list[str] = []
    return NoticeWatcher(str(script), interval_s, notices.append, problems.append, threading.Event(),
                         env={"PATH": "/usr/bin:/bin", "RINGMASTER_HOST": "hostB"}), notices, problems


def test_a_notice_that_appears_moves_and_is_withdrawn(tmp_path) -> None:
    state = tmp_path / "state"
    state.write_text("")
    w, notices, problems = watcher(tmp_path, f'[ "$RINGMASTER_HOST" = hostB ] && cat {state}\nexit 0\n')
    w.check(0.0)
    assert notices == []
    state.write_text("drain 10\n")
    w.check(1.0)
    w.check(2.0)  # the same notice, a second later: said once
    assert notices == [10.0]
    state.write_text("drain 3\n")  # nearer than the notice said
    w.check(3.0)
    assert notices == [10.0, 3.0]
    state.write_text("")
    w.check(4.0)
    assert notices == [10.0, 3.0, None] and problems == []


@pytest.mark.parametrize("body, problem", [
    ("sleep 30\n", "did not finish within 1 s"),
    ("head -c 100000 /dev/zero\n", "printed more than 4096 bytes"),
    ("echo 'preempted!'\n", "print `drain SECONDS`"),
    ("echo metadata unreachable >&2; exit 7\n", "exited with code 7: metadata unreachable"),
])
def test_a_misbehaving_script_is_bounded_reported_once_and_changes_nothing(tmp_path, body, problem) -> None:
    w, notices, problems = watcher(tmp_path, body)
    w.check(0.0)
    w.check(1.0)
    assert notices == [] and len(problems) == 1 and problem in problems[0], problems


def test_a_script_that_cannot_run_says_chmod(tmp_path) -> None:
    script = tmp_path / "notice.sh"
    script.write_text("#!/bin/sh\necho drain 5\n")  # not executable
    problems: list[str] = []
    NoticeWatcher(str(script), 0.5, lambda s: None, problems.append, threading.Event()).check(0.0)
    assert "chmod +x" in problems[0]
