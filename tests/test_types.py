"""The type hints stay true: mypy (pinned in the test extra) finds nothing in the packages."""

import subprocess
import sys

import pytest

from harness import ROOT


def test_mypy_is_clean() -> None:
    pytest.importorskip("mypy", reason="mypy comes with the [test] extra")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent",
         "rendezvous", "discovery", "worker", "checkpoint"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
