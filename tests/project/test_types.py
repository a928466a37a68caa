"""The type hints stay true: mypy (pinned in the test extra) finds nothing in the installed
namespace, nor in the tests, benches and examples that use it (those with optional types
relaxed: a test asserts, then reads). Marked slow: the two runs take half a minute of the fast
suite's two; the whole suite (CI) runs them."""

import os
import pathlib
import subprocess
import sys

import pytest

from harness import ROOT
from namespace_tree import link_tree

pytestmark = pytest.mark.slow


def _mypy(tmp_path: pathlib.Path, *args: str, mypy_path: list[pathlib.Path]) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy comes with the [test] extra")
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nplugins = pydantic.mypy\n")
    env = {**os.environ, "MYPYPATH": os.pathsep.join(str(p) for p in mypy_path)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--ignore-missing-imports",
         "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )


def test_mypy_is_clean_on_the_namespace(tmp_path: pathlib.Path) -> None:
    tree = link_tree(tmp_path / "site")
    proc = _mypy(tmp_path, "-p", "ringmaster", mypy_path=[tree])
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout + proc.stderr


def test_mypy_is_clean_on_tests_benches_and_examples(tmp_path: pathlib.Path) -> None:
    tree = link_tree(tmp_path / "site")
    proc = _mypy(tmp_path, "--no-strict-optional", "--explicit-package-bases", "tests", "bench", "examples",
                 mypy_path=[tree, ROOT / "tests"])
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout + proc.stderr
