"""The code stays linted: `ruff check` (pinned in the test extra, configured in pyproject.toml:
pyflakes, pycodestyle with lines of at most 120 characters, import order) finds nothing in the
product, the tests, the benches, the examples and the docs' hooks. Horovod's own files and the
generated gRPC stubs are left out there, by name."""

import importlib.util
import subprocess
import sys

from harness import ROOT


def test_ruff_finds_nothing() -> None:
    assert importlib.util.find_spec("ruff") is not None, \
        "ruff is not installed: it comes with the test extra (pip install -e '.[test]')"
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, \
        f"ruff check found problems (`ruff check --fix` mends some):\n{proc.stdout}{proc.stderr}"
