"""README.md's two set-up commands stay true: CI runs the test command exactly."""

from harness import ROOT


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    commands = [line.split("#", 1)[0].strip() for line in readme[:20] if line.startswith("bash .ci/setup && ")]
    assert len(commands) == 2, "README.md must open with the demo command and the test command"
    demo, tests = commands
    assert demo.endswith(".venv/bin/ringmaster demo"), demo
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci, f".ci/run must run README's test command: {tests}"
