"""The type hints stay true: mypy (pinned in the test extra) finds nothing in the installed
namespace or in the tests, benches and examples that use it."""

import os
import pathlib
import subprocess
import sys

import pytest

from harness import ROOT
from namespace_tree import link_tree


def test_mypy_is_clean(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mypy", reason="mypy comes with the [test] extra")
    tree = link_tree(tmp_path / "site")
    env = {**os.environ, "MYPYPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent",
         "--cache-dir", str(tmp_path / "cache"), "-p", "ringmaster"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout, proc.stdout
