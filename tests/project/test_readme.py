"""README.md's two set-up commands stay true: CI runs the test command exactly, and the demo's
sets up Python packages only (no apt, no root: tests/e2e/test_demo.py runs it in a copy of the
checkout with apt and sudo that fail if called)."""

import re

from harness import ROOT

DEMO_SETUP = "bash .ci/setup-python && "


def readme_commands() -> tuple[str, str]:
    readme = (ROOT / "README.md").read_text().splitlines()
    commands = [line.split("#", 1)[0].strip() for line in readme[:20] if line.startswith("bash .ci/setup")]
    assert len(commands) == 2, "README.md must open with the demo command and the test command"
    demo, tests = commands
    return demo, tests


def test_ci_runs_the_readme_test_command() -> None:
    demo, tests = readme_commands()
    assert demo == DEMO_SETUP + ".venv/bin/ringmaster demo", demo
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci, f".ci/run must run README's test command: {tests}"


def test_the_demo_setup_names_no_system_package_tool() -> None:
    script = (ROOT / ".ci" / "setup-python").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in script.splitlines())
    assert not re.search(r"\b(apt|apt-get|dpkg|sudo|yum|dnf)\b", code), "the demo's set-up must need no root"
