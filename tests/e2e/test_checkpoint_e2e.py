"""Durable checkpoints in whole jobs: every worker dies, the job is started again (at another
size), the newest checkpoint is damaged, the disk refuses writes.

Real `ringmaster run` jobs with real workers; the faults are real too: SIGKILL of every worker,
bytes truncated or flipped in the file on disk, a read-only bind mount (root) or a folder
without write permission (other users), and the kernel's file-size limit (RLIMIT_FSIZE) for a
disk that takes no more bytes.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess

import pytest
import torch
from harness import FAST, Job, elastic_job, events, read_logs, wait_for
from job_checks import assert_every_sample_once, assert_seen_once_or_padded

from ringmaster.checkpoint.directory import CheckpointDirectory
from ringmaster.checkpoint.manifest import STATE_NAME

pytestmark = pytest.mark.slow


def newest_step(folder: pathlib.Path) -> int:
    steps = [int(p.name.split("-")[1]) for p in CheckpointDirectory(folder).checkpoints()]
    return max(steps, default=0)


def resumed_steps(job) -> list[int]:
    return [e["step"] for e in job.events("checkpoint.resumed")]


def first_synced_after(logs: dict, generation: int) -> list[dict]:
    return [r for r in events(logs, "synced") if r["generation"] == generation]


def test_job_whose_workers_all_die_resumes_from_its_last_checkpoint(run_job, tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    job = run_job("-np", "2", *FAST, "--checkpoint-dir", ckpt, "--checkpoint-every", "4",
                  *elastic_job(tmp_path / "log", epochs=3))
    job.wait_status(lambda s: s["steps"] >= 14 and newest_step(ckpt) >= 8, 120, "two checkpoints on disk")
    status = job.status()
    generation = status["generation"]
    for worker in status["workers"]:
        if worker["pid"] and worker["rank"] is not None:
            os.kill(worker["pid"], signal.SIGKILL)
    # what was durable when the last worker died (the next workers need seconds to start)
    directory = CheckpointDirectory(ckpt)
    newest = directory.checkpoints()[0]
    manifest = directory.verify(newest)
    saved_step = torch.load(newest / STATE_NAME, weights_only=False)["step"]
    assert job.wait(240) == 0, job.output
    logs = read_logs(tmp_path / "log")
    assert resumed_steps(job) == [manifest.step], job.output
    restarted = [r for r in events(logs, "synced") if r["generation"] > generation]
    first = [r for r in restarted if r["generation"] == min(r["generation"] for r in restarted)]
    assert len(first) == 2 and {r["step"] for r in first} == {saved_step}, first
    assert len({r["checksum"] for r in first}) == 1, first
    assert_every_sample_once(logs, 3)  # an epoch may end twice: work after the last checkpoint is redone
    assert {r["size"] for r in events(logs, "done")} == {2}


@pytest.fixture(scope="module")
def killed_first_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A job of 3 workers that saved two checkpoints, then killed whole (launcher, agents,
    workers): its folder holds `ckpt` and its workers' `log1`. Each damage case starts again
    from a copy of them: one first run for the three cases, not one each."""
    folder = tmp_path_factory.mktemp("first-run")
    ckpt = folder / "ckpt"
    first = Job([str(a) for a in ("-np", "3", *FAST, "--checkpoint-dir", ckpt, "--checkpoint-every", "3",
                                  *elastic_job(folder / "log1", epochs=2))])
    try:
        first.wait_status(lambda s: len(CheckpointDirectory(ckpt).checkpoints()) >= 2 and s["steps"] >= 10, 120,
                          "two checkpoints")
    finally:
        first.kill()
        first.save_output(folder / "job-first-run.out")
    return folder


# (one xdist worker for the three: the first run is made once)
@pytest.mark.xdist_group("checkpoint-first-run")
@pytest.mark.parametrize("damage", ["intact", "truncated", "flipped-byte"])
def test_job_started_again_at_another_size_resumes_from_the_newest_good_checkpoint(run_job, tmp_path, damage,
                                                                                   killed_first_run) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(killed_first_run / "ckpt", ckpt)
    shutil.copytree(killed_first_run / "log1", tmp_path / "log1")
    folders = CheckpointDirectory(ckpt).checkpoints()
    newest, before = folders[0], folders[1]
    state_file = newest / STATE_NAME
    if damage == "truncated":
        os.truncate(state_file, state_file.stat().st_size // 2)
    elif damage == "flipped-byte":
        with open(state_file, "r+b") as f:
            f.seek(state_file.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    expected = newest if damage == "intact" else before
    expected_step = int(expected.name.split("-")[1])

    second = run_job("-np", "2", *FAST, "--checkpoint-dir", ckpt, "--checkpoint-every", "3",
                     *elastic_job(tmp_path / "log2", epochs=2))
    assert second.wait(240) == 0, second.output
    assert resumed_steps(second) == [expected_step], second.output
    if damage != "intact":
        (skipped, *_) = second.events("checkpoint.skipped")
        assert str(newest) in skipped["reason"], skipped
        assert ("truncated" if damage == "truncated" else "corrupted") in skipped["reason"], skipped
    logs = read_logs(tmp_path / "log2")
    synced = first_synced_after(logs, 1)
    assert len(synced) == 2 and len({(r["step"], r["checksum"]) for r in synced}) == 1, synced
    assert {r["size"] for r in synced} == {2}
    # the sampler's position and the seen-counter carried over: every epoch the second run
    # finished saw each sample exactly once across both runs, and together they did every epoch
    finished = events(logs, "epoch")
    assert finished
    assert_seen_once_or_padded(logs, finished)
    all_epochs = {r["epoch"] for r in finished} | {r["epoch"] for r in events(read_logs(tmp_path / "log1"), "epoch")}
    assert all_epochs == {0, 1}


@pytest.fixture
def read_only_later(tmp_path):
    """Make a folder read-only for real: a read-only bind mount as root, no write bit otherwise."""
    mounted: list[pathlib.Path] = []

    def make(folder: pathlib.Path) -> None:
        if os.geteuid() != 0:
            for path in (folder, *folder.iterdir()):
                path.chmod(0o555)
            return
        done = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip("running as root without mount privileges, a read-only folder cannot be made: "
                        f"{done.stderr.strip()}")
        mounted.append(folder)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)

    yield make
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_read_only_checkpoint_dir_is_reported_training_goes_on_and_the_end_fails_naming_it(run_job, tmp_path,
                                                                                         read_only_later) -> None:
    ckpt = tmp_path / "ckpt"
    job = run_job("-np", "2", *FAST, "--checkpoint-dir", ckpt, "--checkpoint-every", "2",
                  *elastic_job(tmp_path / "log", epochs=3))
    wait_for(lambda: newest_step(ckpt) >= 4, 120, "a checkpoint on disk")
    read_only_later(ckpt)
    kept = CheckpointDirectory(ckpt).checkpoints()
    manifests = {folder: CheckpointDirectory(ckpt).verify(folder) for folder in kept}
    assert job.wait(240) == 1, job.output  # trained to the end, but its final state is not on disk
    assert job.events("checkpoint.write_failed")
    (failed,) = job.events("job.failed")
    assert "finished training, but worker localhost/1: the final checkpoint" in failed["reason"], failed
    assert CheckpointDirectory(ckpt).checkpoints() == kept
    for folder, manifest in manifests.items():
        assert CheckpointDirectory(ckpt).verify(folder) == manifest
    assert_every_sample_once(read_logs(tmp_path / "log"), 3)


def test_full_disk_is_reported_and_the_previous_checkpoint_stays_intact(run_job, tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    job = run_job("-np", "2", *FAST, "--checkpoint-dir", ckpt, "--checkpoint-every", "2",
                  *elastic_job(tmp_path / "log", epochs=2), "--ballast-mb", "1", "--file-size-limit-at-step", "10")
    assert job.wait(240) == 1, job.output  # its final checkpoint did not reach the disk: the end says so
    assert any("File too large" in e["error"] for e in job.events("checkpoint.write_failed")), job.output
    # ... and the job's end says so, after its summary
    warnings = [e["warning"] for e in job.events("job.warning")]
    assert warnings and warnings[0].startswith("worker localhost/1: the final checkpoint (step"), warnings
    assert "File too large" in warnings[0]
    directory = CheckpointDirectory(ckpt)
    newest = directory.checkpoints()[0]
    assert directory.verify(newest).step <= 10
    logs = read_logs(tmp_path / "log")
    assert max(r["step"] for r in events(logs, "done")) > 20
    assert_every_sample_once(logs, 2)


def test_a_checkpoint_folder_of_another_model_stops_the_job_naming_it(run_job, tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    first = run_job("-np", "2", *FAST, "--checkpoint-dir", ckpt, "--checkpoint-every", "2",
                    *elastic_job(tmp_path / "log1", epochs=1, samples=16))
    assert first.wait(180) == 0, first.output
    other = run_job("-np", "2", *FAST, "--checkpoint-dir", ckpt, *elastic_job(tmp_path / "log2", epochs=1, samples=16),
                    "--hidden", "16")
    assert other.wait(180) == 1, other.output
    assert (
        "does not fit this model: model.0.weight has shape [8, 4] float32 in the checkpoint and [16, 4] float32 here"
        in other.output
    )
    assert not other.events("generation.formed", number=2)  # stopped, not restarted over and over


def test_a_checkpoint_folder_that_cannot_be_written_fails_the_job_at_once_naming_it(run_job, tmp_path) -> None:
    (tmp_path / "plain").write_text("a file, not a folder")
    ckpt = tmp_path / "plain" / "ckpt"
    job = run_job("-np", "2", *FAST, "--checkpoint-dir", ckpt, *elastic_job(tmp_path / "log", epochs=1, samples=16))
    assert job.wait(180) == 1, job.output
    (failed,) = job.events("job.failed")
    assert f"the checkpoint folder {ckpt} cannot be written" in failed["reason"], failed
    assert not job.events("host.blacklisted") and not job.events("generation.formed", number=2)
    assert not (tmp_path / "log").exists() or not events(read_logs(tmp_path / "log"), "commit")  # nothing trained


class _Planted:
    """What a hostile neighbour writes into a checkpoint: unpickling it runs a command."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_checkpoint_runs_no_code_and_stops_the_job_naming_it(run_job, tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    first = run_job("-np", "2", *FAST, "--checkpoint-dir", ckpt, "--checkpoint-every", "2",
                    *elastic_job(tmp_path / "log1", epochs=1, samples=16))
    assert first.wait(180) == 0, first.output
    # A newer checkpoint with a matching manifest (checksums prove nothing about who wrote it).
    marker = tmp_path / "code-ran"
    directory = CheckpointDirectory(ckpt)
    good = directory.checkpoints()[0]
    tree = torch.load(good / STATE_NAME, weights_only=True)
    tree["extra"] = _Planted(marker)
    step = newest_step(ckpt) + 1
    directory.write(tree, step, 2, 1, 0.0)
    again = run_job("-np", "2", *FAST, "--checkpoint-dir", ckpt, *elastic_job(tmp_path / "log2", epochs=1, samples=16))
    assert again.wait(180) == 1, again.output
    assert not marker.exists()
    assert "holds an object of posix.system" in again.output and "--checkpoint-trusted" in again.output
    assert not again.events("generation.formed", number=2)  # stopped, not restarted over and over
    # The job's own cause ends it at once (not --elastic-timeout later), named in its end, and no
    # host is blamed for it.
    (failed,) = again.events("job.failed")
    assert f"step-{step:012d}" in failed["reason"] and "refused" in failed["reason"], failed
    assert not again.events("host.blacklisted"), again.output
    assert (ckpt / f"step-{step:012d}").is_dir() and good.is_dir()  # nothing pruned
