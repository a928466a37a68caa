"""Drains with real agents and workers: a host taken politely costs no committed work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from harness import FAST, ROOT, elastic_job, events, read_logs, wait_for

pytestmark = pytest.mark.slow


def redone(logs: dict[str, list[dict]]) -> int:
    """Steps a worker began more than once (each `begin` names the step it starts)."""
    total = 0
    for records in logs.values():
        begun = [r["step"] for r in records if r["event"] == "begin"]
        total += len(begun) - len(set(begun))
    return total


def cli(job, *args: str) -> subprocess.CompletedProcess:
    """A `ringmaster` verb against the job's control API (the tests' secret is in the environment)."""
    return subprocess.run([sys.executable, "-m", "ringmaster.cli", *args, "--api", job.api_url or job.wait_api()],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def host_state(job, host: str) -> str:
    return next(h["state"] for h in job.status()["hosts"] if h["name"] == host)


def test_sigterm_to_a_hosts_process_group_drains_it_at_a_commit(run_job, tmp_path) -> None:
    """Kubernetes' and Slurm's way: SIGTERM to every process of the host. Its worker leaves at
    its next commit, nothing is rolled back or blacklisted, and its agent exits 0."""
    log = tmp_path / "log"
    job = run_job("-H", "hostA:1,hostB:1", "--min-np", "1", *FAST,
                  *elastic_job(log, epochs=3, samples=240, step_time=0.05), "--timestamps")
    job.wait_status(lambda s: s["steps"] >= 5, 120, "training")
    job.kill_host("hostB", signal.SIGTERM)
    drained = job.wait_event("host.drained", 60, host="hostB")
    assert drained["outcome"] == "commit", drained
    assert job.wait_event("agent.stopping", 30, host="hostB")["reason"].startswith("host drained")
    assert job.wait(240) == 0, job.output[-3000:]
    for noise in ("worker.failed", "host.blacklisted", "host.lost", "generation.over"):
        assert not job.events(noise), (noise, job.events(noise))
    logs = read_logs(log)
    assert redone(logs) == 0
    assert {r["size"] for r in events(logs, "synced") if r["generation"] >= 2} == {1}


def test_a_notice_script_that_flips_to_drain_drains_that_host(run_job, tmp_path) -> None:
    notice = tmp_path / "notice"
    notice.write_text("")
    script = tmp_path / "notice.sh"
    script.write_text(f'#!/bin/sh\n[ "$RINGMASTER_HOST" = hostB ] && cat {notice}\nexit 0\n')
    script.chmod(0o755)
    log, stop = tmp_path / "log", tmp_path / "stop"
    # Trains until told to stop: hostB's newcomer may start in a spare still importing torch
    # (13 s beside a CPU hog), longer than a job of fixed length had left to train.
    job = run_job("-H", "hostA:1,hostB:1", "--min-np", "1", "--preemption-notice-script", script,
                  "--notice-interval", "0.2", *FAST, *elastic_job(log, epochs=1000, samples=240, step_time=0.05),
                  "--timestamps", "--stop-file", stop)
    job.wait_status(lambda s: s["steps"] >= 5, 120, "training")
    notice.write_text("drain 10\n")
    job.wait_event("host.draining", 30, host="hostB")
    assert job.wait_event("host.drained", 60, host="hostB")["outcome"] == "commit"
    assert host_state(job, "hostB") == "drained"
    notice.write_text("")  # withdrawn: the host takes workers again
    job.wait_event("host.undrained", 30, host="hostB")
    back = job.wait_status(lambda s: s["world_size"] == 2, 120, "hostB back in the ring")
    job.wait_status(lambda s: s["steps"] >= back["steps"] + 3, 60, "training with hostB again")
    stop.touch()
    assert job.wait(240) == 0, job.output[-3000:]
    assert redone(read_logs(log)) == 0
    assert not job.events("host.blacklisted") and not job.events("worker.failed")


def test_a_deadline_before_the_next_commit_stops_the_workers_and_costs_the_uncommitted_steps(run_job, tmp_path) -> None:
    """The job commits only at the end of its one epoch (200 steps of at least 0.05 s on two
    workers): the drain, asked for a few steps in, has at least 9 s of runway before that commit
    for the CLI to start and its 1 s deadline to pass, on a slow machine too."""
    log = tmp_path / "log"
    job = run_job("-H", "hostA:1,hostB:1", "--min-np", "1", *FAST,
                  *elastic_job(log, epochs=1, samples=800, step_time=0.05), "--commit-every", "1000", "--timestamps")
    refused = cli(job, "drain", "nope")  # (before training: each CLI call costs the runway a second or more)
    assert refused.returncode != 0 and "no host 'nope'" in refused.stderr, refused
    refused = cli(job, "drain", "hostB", "--deadline", "-1")
    assert refused.returncode != 0 and "deadline_s" in refused.stderr, refused
    job.wait_status(lambda s: s["world_size"] == 2, 120, "the ring")
    wait_for(lambda: len(events(read_logs(log), "begin")) >= 10 or None, 120, "some steps")
    drained = cli(job, "drain", "hostB", "--deadline", "1")
    assert drained.returncode == 0 and "within 1 s" in drained.stdout, drained
    done = job.wait_event("host.drained", 60, host="hostB")
    assert done["outcome"] == "deadline" and done["uncommitted_s"] > 0 and done["steps_lost"] > 0, done
    assert job.events("generation.over"), "the others rolled back"
    assert not job.events("host.blacklisted")
    assert job.wait(300) == 0, job.output[-3000:]
    assert redone(read_logs(log)) > 0  # what the deadline cost: the steps since the last commit


def test_draining_the_last_host_checkpoints_first_and_a_restart_resumes_there(run_job, tmp_path) -> None:
    log, checkpoints = tmp_path / "log", tmp_path / "ckpt"
    flags = ["-np", "1", "--min-np", "1", "--checkpoint-dir", checkpoints, "--checkpoint-interval", "3600",
             "--elastic-timeout", "3", *FAST]
    job = run_job(*flags, *elastic_job(log, epochs=3, samples=300, step_time=0.05))
    job.wait_status(lambda s: s["steps"] >= 8, 120, "training")
    job.kill_host("localhost", signal.SIGTERM)
    assert job.wait_event("host.drained", 60, host="localhost")["outcome"] == "commit"
    assert job.wait(120) == 1, "no host left: the job fails after --elastic-timeout"
    last = max(r["step"] for r in events(read_logs(log), "commit"))
    again = run_job(*flags, *elastic_job(log, epochs=3, samples=300, step_time=0.05))
    assert again.wait(240) == 0, again.output[-3000:]
    synced = [r for r in events(read_logs(log), "synced")]
    assert synced[-1]["step"] >= last, (last, synced[-1])


def test_sigterm_twice_stops_the_hosts_workers_now_and_the_others_lose_nothing_committed(run_job, tmp_path) -> None:
    """The second signal is the user's impatience: the host's workers are stopped at once and the
    others roll back to their last commit (no committed step lost, the host not blacklisted). The
    job's one commit ends its one epoch, 200 steps away: the second signal comes before it."""
    log = tmp_path / "log"
    job = run_job("-H", "hostA:1,hostB:1", "--min-np", "1", "--drain-grace", "60", *FAST,
                  *elastic_job(log, epochs=1, samples=800, step_time=0.05), "--commit-every", "1000", "--timestamps")
    job.wait_status(lambda s: s["world_size"] == 2, 120, "the ring")
    wait_for(lambda: len(events(read_logs(log), "begin")) >= 10 or None, 120, "some steps")
    job.kill_host("hostB", signal.SIGTERM)
    job.wait_event("agent.draining", 30, host="hostB")
    job.kill_host("hostB", signal.SIGTERM)
    assert "again" in job.wait_event("agent.stopping", 30, host="hostB")["reason"]
    job.wait_status(lambda s: s["world_size"] == 1, 60, "the job on hostA alone")
    assert not job.events("host.blacklisted")
    assert job.wait(300) == 0, job.output[-3000:]


def test_sigterm_during_a_reset_drains_the_host_and_the_job_loses_no_committed_step(run_job, tmp_path) -> None:
    """hostC dies outright and hostB gets SIGTERM in the same instant: the ring is re-formed
    once, without hostB, whose worker leaves from the reset instead of a commit; hostB is not
    blacklisted, its agent exits 0, and every generation starts from the last commit."""
    from job_checks import assert_every_sample_once, assert_ranks_agree

    log = tmp_path / "log"
    job = run_job("-H", "hostA:1,hostB:1,hostC:1", "--min-np", "1", *FAST,
                  *elastic_job(log, epochs=3, samples=360, step_time=0.05), "--timestamps")
    job.wait_status(lambda s: s["world_size"] == 3 and s["steps"] >= 5, 120, "training on three hosts")
    pids = {h["name"]: h["agent_pid"] for h in job.status()["hosts"]}
    os.killpg(pids["hostC"], signal.SIGKILL)
    os.killpg(pids["hostB"], signal.SIGTERM)
    drained = job.wait_event("host.drained", 60, host="hostB")
    assert drained["outcome"] in ("commit", "idle"), drained
    assert job.wait_event("agent.stopping", 30, host="hostB")["reason"].startswith("host drained")
    job.wait_status(lambda s: s["world_size"] == 1, 60, "the job on hostA alone")
    assert job.wait(240) == 0, job.output[-3000:]
    assert not job.events("host.blacklisted", host="hostB")
    logs = read_logs(log)
    assert_ranks_agree(logs)
    assert_every_sample_once(logs, 3)
    committed: dict[int, int] = {}
    for r in events(logs, "commit"):
        committed[r["generation"]] = max(committed.get(r["generation"], 0), r["step"])
    for r in events(logs, "synced"):
        before = [step for generation, step in committed.items() if generation < r["generation"]]
        assert not before or r["step"] >= max(before), ("a generation began before the last commit", r, committed)
