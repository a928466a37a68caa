"""`ringmaster demo --quick` end to end, set up as README.md's first command sets it up
(`.ci/setup-python` in a copy of the checkout, with apt and sudo that fail if called): a real
elastic job that loses a host, gets it back and scales, narrated, ending with a picture and the
accuracy beside a fault-free run's."""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import signal
import subprocess

import psutil
import pytest
from harness import copy_checkout

from ringmaster.settings import SPARES_ENV

pytestmark = pytest.mark.slow

PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture
def reaped():
    """The demo starts `ringmaster run` in a session of its own, which starts the emulated hosts in
    theirs: this process becomes their subreaper, so at teardown every process the test started,
    orphaned or not, is found among its descendants and killed. It stops being one then: a
    subreaper for the rest of the session adopted every later test's orphans (a killed host's
    workers) and, never waiting for them, kept them as zombies (74 in one pytest worker)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        _kill_and_reap(before)


def _kill_and_reap(before: set[int]) -> None:
    """Kill every descendant not there `before`, and wait for this process' own new children."""
    for child in psutil.Process().children(recursive=True):
        if child.pid not in before:
            try:
                child.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
    for child in psutil.Process().children():
        if child.pid not in before:
            try:
                child.wait(timeout=10)
            except psutil.Error:
                pass


#: System package tools (and sudo) that README's demo command must not call.
_ROOT_TOOLS = ("apt", "apt-get", "dpkg", "sudo")


def set_up_as_the_readme_says(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the checkout with `.ci/setup-python` run in it (README's first command before
    `.venv/bin/ringmaster demo`), apt and sudo on the PATH replaced by tools that fail and leave
    a mark: the demo's set-up must need neither."""
    checkout = copy_checkout(tmp_path / "checkout")
    tools, called = tmp_path / "no-root-tools", tmp_path / "root-tool-called"
    tools.mkdir()
    for tool in _ROOT_TOOLS:
        (tools / tool).write_text(f"#!/bin/sh\necho {tool} >> {called}\nexit 97\n")
        (tools / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(["bash", ".ci/setup-python"], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not called.exists(), f"the demo's set-up called {called.read_text().split()}"
    return checkout


# (the set-up: a venv with torch; the demo itself is given 600 s: a fault-free run and the faulted one)
@pytest.mark.timeout(1500)
def test_the_quick_demo_shows_a_host_killed_brought_back_and_scaling(tmp_path, reaped) -> None:
    checkout = set_up_as_the_readme_says(tmp_path)
    out = tmp_path / "demo"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # the fault-free run is made, not cached
    env.pop(SPARES_ENV, None)  # the demo as a user sees it: warm spares on
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(checkout / ".venv" / "bin" / "ringmaster"), "demo", "--quick", "--out", str(out)],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    said = done.stdout
    for narration in ("killing hostB now", "hostB is back", "scaling down to 2 workers", "scaling up to 4 workers"):
        assert narration in said, said

    # The picture: a PNG of the expected size with three panels (the axes' labels are drawn in it).
    from matplotlib import image

    pixels = image.imread(out / "demo.png")
    assert pixels.shape[:2] == (900, 1000) and pixels.std() > 0.05

    # The accuracy: above what a broken model reaches (10 classes: chance is 10%).
    reported = [line for line in said.splitlines() if line.startswith("test accuracy")]
    assert reported, said
    accuracy, baseline = (float(part.split("%")[0].split()[-1]) for part in reported[0].split("(fault-free"))
    assert accuracy > 85.0 and baseline > 85.0, reported
    # The global batch, summed exactly: the run through a kill and resizes computes the fault-free
    # run's bits, so their losses (printed to 8 significant digits) and accuracies are the same.
    (compared,) = [line for line in said.splitlines() if line.startswith("loss at every step")]
    # (10 epochs of 22 steps; a line of rank 0's can be lost in the job's interleaved output, so
    # the count compared may be one or two short of 220)
    shared = int(compared.split("the same loss at all ")[1].split()[0]) if "the same loss at all" in compared else 0
    assert 200 <= shared <= 220, compared
    assert accuracy == baseline, reported

    # The events show exactly the faults and changes narrated, and the job succeeded.
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines() if line.startswith("{")]
    kinds = [e["kind"] for e in events]
    assert [e["host"] for e in events if e["kind"] == "host.lost"] == ["hostB"]
    assert {e["worker"].split("/")[0] for e in events if e["kind"] == "worker.failed"} == {"hostB"}
    assert [e["np"] for e in events if e["kind"] == "scale.requested"] == [2, 4]
    assert [e["description"] for e in events if e["kind"] == "hosts.changed"] == ["removed hostB", "added hostB:2"]
    # 4, 2 after the kill, back to 4, 2, 4. Newcomers that warm up together join in one reset; on a
    # loaded machine one may be ready past --warmup-grace before the other, and joins one reset later.
    sizes = [e["size"] for e in events if e["kind"] == "generation.formed"]
    assert sizes[:2] == [4, 2] and sizes[-1] == 4 and sizes.count(2) == 2, sizes
    back, scaled = sizes[2:sizes.index(2, 2)], sizes[sizes.index(2, 2) + 1:]
    for growth in (back, scaled):
        assert growth and growth == sorted(growth) and growth[-1] == 4 and all(2 < n <= 4 for n in growth), sizes
    assert kinds.count("job.recovered") == 1 and "job.succeeded" in kinds
    assert [e["message"].split()[0] for e in events if e["kind"] == "demo.act"] == ["killing",
                                                                                    "hostB", "scaling", "scaling"]
    assert "what happened:" in said and "recovered in" in said

    # `ringmaster plot` draws the same folder again.
    again = subprocess.run([str(checkout / ".venv" / "bin" / "ringmaster"), "plot", str(out), "-o",
                            str(tmp_path / "again.png")],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and f"{len(sizes)} generation(s)" in again.stdout, again
