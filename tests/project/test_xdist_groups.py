"""Tests of one `xdist_group` run on one pytest-xdist worker (`tests/xdist_groups.py` mends
pytest-xdist 3.8's group marks under pytest 9). A real pytest with two workers on a toy folder.
Marked slow: two interpreters start pytest-xdist workers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness import ROOT

pytestmark = pytest.mark.slow

TOY = '''
import os, pytest
pytestmark = pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i, request):
    with open(os.environ["RECORD"], "a") as f:
        f.write(f"{request.node.nodeid} {os.environ['PYTEST_XDIST_WORKER']}\\n")
@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    pass
'''


def test_the_tests_of_a_group_run_on_one_worker(tmp_path) -> None:
    (tmp_path / "test_toy.py").write_text(TOY)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    record = tmp_path / "record.txt"
    env = {**os.environ, "RECORD": str(record), "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "xdist_groups", "-n", "2", "--dist", "loadgroup",
                           "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split() for line in record.read_text().splitlines()]
    assert len(ran) == 6 and all(nodeid.endswith("@together") for nodeid, _ in ran), ran
    assert len({worker for _, worker in ran}) == 1, ran
