"""An elastic job is elastic from its first second: workers that hold the interpreter for 5 s
between hvd.init() and hvd.elastic.run (their heartbeat threads cannot run) with a 3 s
--heartbeat-timeout are busy, not dead; one SIGSTOPped in the same window is still found within
the heartbeat bound and the job goes on without it; a host SIGKILLed in that window leaves the
job going on. Real run, agents, workers and Gloo rings."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import elastic_job, read_logs, wait_for
from job_checks import assert_every_sample_once

pytestmark = pytest.mark.slow

FLAGS = ["-H", "hostA:2,hostB:2", "--min-np", "2", "--max-np", "4", "--heartbeat-timeout", "3",
         "--discovery-interval", "0.3", "--spares", "0"]


def alive(job):
    """A condition's guard: a job that already exited fails the wait at once, with its output."""
    if job.proc.poll() is not None:
        raise AssertionError(f"the job exited ({job.proc.returncode}) while the test waited:\n{job.output[-6000:]}")
    return True


def test_workers_busy_for_5_s_before_elastic_run_are_not_dead_and_a_stopped_one_is(run_job, tmp_path) -> None:
    busy_log = tmp_path / "busy"
    job = run_job(*FLAGS, *elastic_job(busy_log, epochs=2, samples=64, step_time=0.02), "--busy-start", "5")
    assert job.wait(240) == 0, job.output[-6000:]
    assert not job.events("worker.failed"), job.story() if hasattr(job, "story") else job.output[-6000:]
    logs = read_logs(busy_log)
    assert sum(1 for records in logs.values() for r in records if r.get("event") == "busy_end") == 4
    assert {r["size"] for records in logs.values() for r in records if r.get("event") == "commit"} == {4}
    assert_every_sample_once(logs, 2)

    # The same start, one of hostB's workers SIGSTOPped while it is busy: the kernel says it is
    # stopped, so its silence counts after --heartbeat-timeout, as any stopped worker's.
    stop_log = tmp_path / "stop"
    job = run_job(*FLAGS, *elastic_job(stop_log, epochs=2, samples=64, step_time=0.02), "--busy-start", "5")
    stopped = wait_for(lambda: alive(job) and next((r for name, records in read_logs(stop_log).items()
                                                     if name.startswith("hostB") for r in records
                                                     if r.get("event") == "busy_start"), None), 120, "hostB busy")
    os.kill(stopped["pid"], signal.SIGSTOP)
    stopped_at = time.time()
    try:
        failed = wait_for(lambda: alive(job) and job.events("worker.failed"), 60, "the stopped worker failed")
        assert "hung or stopped" in failed[0]["reason"], failed
        # Within the heartbeat bound: --heartbeat-timeout (3 s) after its last beat, and the agent's
        # word that it was busy (two of the agent's 1 s beats) ran out; not --busy-timeout (120 s).
        assert failed[0]["time"] - stopped_at < 3 + 2 + 3, (failed[0]["time"] - stopped_at, job.story())
        assert job.wait(240) == 0, job.output[-6000:]
    finally:
        try:
            os.kill(stopped["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert len(job.events("worker.failed")) == 1, job.events("worker.failed")
    assert_every_sample_once(read_logs(stop_log), 2)


def test_a_host_killed_while_its_workers_are_busy_starting_leaves_the_job_going_on(run_job, tmp_path) -> None:
    log = tmp_path / "log"
    job = run_job(*FLAGS, *elastic_job(log, epochs=2, samples=64, step_time=0.02), "--busy-start", "5")
    wait_for(lambda: alive(job) and any(r.get("event") == "busy_start" for name, records in read_logs(log).items()
                                        if name.startswith("hostB") for r in records), 120, "hostB busy")
    job.kill_host("hostB")
    assert job.wait(240) == 0, job.output[-6000:]
    assert job.events("host.lost", host="hostB"), job.story()
    logs = read_logs(log)
    assert {r["size"] for records in logs.values() for r in records if r.get("event") == "commit"} == {2}
    assert_every_sample_once(logs, 2)
