"""What a newcomer meets in the first hour, from the quick start on: real jobs, real commands."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from harness import FAST, ROOT, elastic_job

pytestmark = pytest.mark.slow


def test_scale_finds_the_secret_run_made_and_nobody_else_can_read_it(run_job, tmp_path) -> None:
    """`run` without --secret-file makes a secret; `ringmaster scale --api URL` (the quick
    start's next step) finds it in the owner's private run folder, and it is gone at the end."""
    env = {"RINGMASTER_SECRET": None, "XDG_RUNTIME_DIR": str(tmp_path / "runtime")}
    job = run_job("-np", "2", "--min-np", "1", *FAST, *elastic_job(tmp_path / "log", epochs=4, samples=192), env=env)
    saved = job.wait_event("job.secret_saved")
    path = saved["path"]
    assert path == str(tmp_path / "runtime" / "ringmaster" / f"api-{saved['url'].rsplit(':', 1)[1]}.secret")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    job.wait_status(lambda s: s["steps"] >= 3, 120, "training")
    command_env = {k: v for k, v in os.environ.items() if k != "RINGMASTER_SECRET"}
    command_env["XDG_RUNTIME_DIR"] = env["XDG_RUNTIME_DIR"]
    scaled = subprocess.run([sys.executable, "-m", "ringmaster.cli", "scale", "--api", saved["url"], "-np", "1"],
                            cwd=ROOT, env=command_env, capture_output=True, text=True, timeout=60)
    assert scaled.returncode == 0 and "scaling to 1 workers" in scaled.stdout, scaled.stderr
    job.wait_status(lambda s: s["world_size"] == 1, 120, "the job to shrink to 1")
    elsewhere = dict(command_env, XDG_RUNTIME_DIR=str(tmp_path / "another-user"))  # no file there: refused
    refused = subprocess.run([sys.executable, "-m", "ringmaster.cli", "scale", "--api", saved["url"], "-np", "2"],
                             cwd=ROOT, env=elsewhere, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "job secret" in refused.stderr + refused.stdout
    assert job.wait(240) == 0, job.output[-3000:]
    assert not os.path.exists(path)


def test_ctrl_c_stops_the_job_quietly_and_exits_130(run_job, tmp_path) -> None:
    """Ctrl-C is the user's choice, not a failure: one line says the job was stopped by the
    user, nothing about workers failing or reports refused, and the exit code is 130 as shells
    expect of a command ended by SIGINT (143 for SIGTERM)."""
    import signal

    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        job = run_job("-np", "2", *FAST, *elastic_job(tmp_path / f"log{code}", epochs=30, samples=320))
        job.wait_status(lambda s: s["steps"] >= 5, 120, "training")
        job.proc.send_signal(sig)
        assert job.wait(60) == code, job.output[-3000:]
        (summary,) = job.events("job.summary")
        assert summary["outcome"] == "stopped by the user" and summary["level"] == "INFO"
        for noise in ("worker.failed", "generation.over", "agent.report_refused", "job.failed"):
            assert not job.events(noise), (noise, job.output[-3000:])


def test_a_plain_script_fails_on_its_first_error_and_on_a_late_one(run_job, tmp_path) -> None:
    """As torchrun and horovodrun: a plain script's worker error fails the job (no restarts by
    default), and so does rank 1's error after rank 0 finished: `run` exits 1 either way."""
    from harness import WORKLOADS

    first = run_job("-np", "2", "python", str(WORKLOADS / "plain_ddp.py"), "--fail-once", tmp_path / "marker")
    assert first.wait(120) == 1, first.output[-3000:]
    assert "--max-restarts 0" in first.events("job.failed")[0]["reason"]
    assert len(first.events("generation.formed")) == 1  # never restarted
    late = run_job("-np", "2", "python", str(WORKLOADS / "plain_ddp.py"), "--last-exit", "3")
    assert late.wait(120) == 1, late.output[-3000:]
    assert "after another worker had finished" in late.events("job.failed")[0]["reason"]


def test_a_worker_that_cannot_start_fails_the_job_at_once_in_its_own_words(run_job, tmp_path) -> None:
    """`ringmaster run -np 2 python examples/trian.py` (a typo): one generation, no relaunches,
    no blacklisting talk; the job fails naming the command and what Python said."""
    job = run_job("-np", "2", "python", str(tmp_path / "trian.py"))
    assert job.wait(60) == 1, job.output[-3000:]
    (failed,) = job.events("job.failed")
    assert "before it reached the rendezvous" in failed["reason"] and "can't open file" in failed["reason"]
    assert "trian.py" in failed["reason"]
    assert len(job.events("generation.formed")) == 1
    assert not job.events("host.spared") and not job.events("host.blacklisted")


def test_status_counts_the_first_step_without_waiting_for_a_heartbeat(run_job, tmp_path) -> None:
    """`status` after the first printed epoch said `0 steps committed`: the reset's sync reported
    commit 0 at once and used up the prompt report, so the first real commit waited for the next
    heartbeat. With heartbeats 30 s apart, the first step must still be counted within seconds."""
    import time

    from harness import events, read_logs, wait_for

    log = tmp_path / "log"
    job = run_job("-np", "1", "--heartbeat-interval", "30", "--heartbeat-timeout", "120", *FAST,
                  *elastic_job(log, epochs=1, samples=48, step_time=0.5), "--timestamps")
    first = wait_for(lambda: events(read_logs(log), "commit") or None, 120, "the first commit")
    seen = job.wait_status(lambda s: s["steps"] >= 1, 10, "status to count the first step")
    assert seen["steps"] >= 1
    assert time.time() - first[0]["time"] < 10
    assert job.wait(180) == 0, job.output[-3000:]
