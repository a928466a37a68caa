"""The type hints stay true: mypy (pinned in the test extra) finds nothing in the installed
namespace, nor in the tests, benches and examples that use it (those with optional types
relaxed: a test asserts, then reads). One run checks both (the namespace strict, the rest
relaxed per module): two runs analysed the namespace twice, 62 s of the suite's CPU against 36 s.
Marked slow: half a minute of the fast suite's budget; the whole suite (CI) runs it."""

import os
import pathlib
import subprocess
import sys

import pytest
from harness import ROOT
from namespace_tree import link_tree

pytestmark = pytest.mark.slow

#: The namespace with strict optional types, everything else (tests, benches, examples) without.
CONFIG = """[mypy]
plugins = pydantic.mypy
strict_optional = False

[mypy-ringmaster.*]
strict_optional = True
"""


def test_mypy_is_clean_on_the_namespace_and_on_the_tests_benches_and_examples(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mypy", reason="mypy comes with the [test] extra")
    tree = link_tree(tmp_path / "site")
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG)
    env = {**os.environ, "MYPYPATH": os.pathsep.join([str(tree), str(ROOT / "tests")])}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--ignore-missing-imports",
         "--follow-imports=silent", "--explicit-package-bases", "--cache-dir", str(tmp_path / "cache"),
         "--exclude", "tests/horovod/",  # (Horovod's own test files, as they are: not ours to type)
         str(tree / "ringmaster"), "tests", "bench", "examples"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout + proc.stderr
    checked = int(proc.stdout.split("Success: no issues found in ")[1].split()[0])
    assert checked > 300, proc.stdout  # (the namespace's files and the tests' all seen: 355 today)
