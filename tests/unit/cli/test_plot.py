"""`ringmaster plot`: a real PNG of a job's log, drawn by matplotlib; its refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")

from ringmaster.cli.plot import DPI, SIZE_IN, draw, figure  # noqa: E402
from ringmaster.common.job_history import read_history  # noqa: E402

T = 1_800_000_000.0


def job_log() -> list[str]:
    def event(at, kind, **fields):
        return json.dumps({"time": T + at, "kind": kind, "message": kind, **fields})

    def step(at, n, **fields):
        return "[hostA/1] " + json.dumps({"step": n, "time": T + at, **fields})

    return [event(0, "generation.formed", number=1, size=4, cause="job start", causes=[]),
            *[step(0.1 * i, i, loss=1.0 / i) for i in range(1, 20)],
            event(2.0, "host.lost", message="host hostB lost: its agent closed its connection"),
            event(2.01, "generation.formed", number=2, size=2, cause="host hostB lost", causes=["host_lost"]),
            event(2.1, "job.recovered", seconds=0.09, number=2),
            *[step(2.1 + 0.1 * i, 19 + i, loss=0.05) for i in range(10)],
            step(3.0, 28, accuracy=0.9, epoch=1)]


def test_three_panels_in_a_png_of_the_expected_size(tmp_path) -> None:
    from matplotlib import image

    history = read_history(job_log())
    fig = figure(history, "a job")
    assert [ax.get_ylabel() for ax in fig.axes] == ["training loss (rank 0)", "test accuracy (%)", "world size"]
    marks = [t.get_text() for t in fig.axes[2].texts]
    assert any("host hostB lost" in m and "recovered in 0.09 s" in m for m in marks), marks
    out = draw(history, tmp_path / "job.png")
    pixels = image.imread(out)
    assert pixels.shape[:2] == (int(SIZE_IN[1] * DPI), int(SIZE_IN[0] * DPI))
    assert pixels.std() > 0.05, "the picture is not blank"


def ringmaster(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringmaster.cli", *args], capture_output=True, text=True, timeout=120,
                          **kwargs)


def test_the_verb_on_a_saved_log_and_on_a_run_folder(tmp_path) -> None:
    log = tmp_path / "job.jsonl"
    log.write_text("\n".join(job_log()) + "\n")
    done = ringmaster("plot", str(log), "-o", str(tmp_path / "a.png"))
    assert done.returncode == 0 and "wrote" in done.stdout and (tmp_path / "a.png").stat().st_size > 10_000, done
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "events.jsonl").write_text(log.read_text())
    assert ringmaster("plot", str(folder), "-o", str(tmp_path / "b.png")).returncode == 0


def test_against_another_run_draws_its_loss_and_says_the_largest_difference(tmp_path) -> None:
    """`--against`: the other run's loss drawn under this one's, and the largest relative
    difference at a step both trained, where a step said twice (trained again after a rollback)
    counts as its last saying."""
    mine, theirs = tmp_path / "mine.jsonl", tmp_path / "theirs.jsonl"
    lines = job_log()
    mine.write_text("\n".join(lines) + "\n")
    theirs.write_text("\n".join(lines) + "\n")
    same = ringmaster("plot", str(mine), "-o", str(tmp_path / "a.png"), "--against", str(theirs))
    assert same.returncode == 0 and "the same loss at all 28 steps" in same.stdout, same
    redone = json.dumps({"step": 5, "time": T + 3.5, "loss": 0.2 * 1.01})  # step 5 again, its loss 1% off
    theirs.write_text("\n".join([*lines, "[hostA/1] " + redone]) + "\n")
    history, other = read_history(mine.read_text().splitlines()), read_history(theirs.read_text().splitlines())
    worst, step, steps = history.largest_loss_difference(other)
    assert step == 5 and steps == 28 and worst == pytest.approx(0.01 / 1.01)
    fig = figure(history, "a job", other)
    assert [line.get_label() for line in fig.axes[0].lines][:2] == ["fault-free run", "this run"]
    assert "largest relative difference 9.9e-03 (step 5 of 28)" in fig.axes[0].get_legend().get_title().get_text()


def test_refusals_name_what_was_wrong(tmp_path) -> None:
    missing = ringmaster("plot", str(tmp_path / "nope"), "-o", str(tmp_path / "x.png"))
    assert missing.returncode == 2 and "no such log" in missing.stderr, missing
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\n[hostA/1] not json\n")
    empty = ringmaster("plot", str(junk), "-o", str(tmp_path / "x.png"))
    assert empty.returncode == 2 and "holds no Ringmaster events" in empty.stderr, empty
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("verb", [["plot", "LOG", "-o", "x.png"], ["demo", "--quick"]])
def test_without_the_demo_extra_the_message_names_it(tmp_path, verb) -> None:
    """matplotlib is installed here, so its absence is made by blocking the import (the one
    fault of this file that cannot be made for real)."""
    log = tmp_path / "job.jsonl"
    log.write_text("\n".join(job_log()))
    args = [str(log) if a == "LOG" else a for a in verb]
    code = ("import sys; sys.modules['matplotlib'] = None; from ringmaster.cli.main import main; "
            f"sys.exit(main({args!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "pip install 'ringmaster[demo]'" in done.stderr, done
