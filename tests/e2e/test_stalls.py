"""The rendezvous itself stalls (a real SIGSTOP of its process for 7 s, then SIGCONT: longer than
its heartbeat timeout, set to 4 s here, and its leader lease of 3 s), as a long GC pause,
swapping or a starved machine would stop it. Workers train on meanwhile; when it
runs again it must judge liveness by the heartbeats that arrive from then on (it was deaf, they
were not dead), keep leading when nobody else took over, and finish the job without a reset.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import elastic_job, events, read_logs, wait_for
from job_checks import assert_every_sample_once

pytestmark = pytest.mark.slow

#: The job's --heartbeat-timeout (default 10 s): the stall lasts longer than it.
HEARTBEAT_TIMEOUT_S = 4.0
STALL_S = 7.0


def commits(log_dir) -> int:
    return len(events(read_logs(log_dir), "commit"))


@pytest.mark.parametrize("store", ["memory", "etcd"])
def test_a_rendezvous_stopped_longer_than_its_heartbeat_timeout_carries_on_without_losing_a_host(
        run_job, tmp_path, store, request) -> None:
    flags = ["-H", "hostA:1,hostB:1", "--discovery-interval", "0.3", "--start-timeout", "20",
             "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S)]
    if store == "etcd":
        server = request.getfixturevalue("own_etcd")
        flags += ["--store", f"etcd://{server.address}/jobs/stall"]
    log = tmp_path / "log"
    job = run_job(*flags, *elastic_job(log, epochs=2, samples=320, step_time=0.08))
    wait_for(lambda: commits(log) >= 10, 120, "training to commit steps")
    os.kill(job.proc.pid, signal.SIGSTOP)
    try:
        before = commits(log)
        # The fault is the stall itself: the rendezvous does not run for STALL_S.
        time.sleep(STALL_S)
        during = commits(log) - before
    finally:
        os.kill(job.proc.pid, signal.SIGCONT)
    assert during > 10, "the workers should train on while the rendezvous is stopped"
    assert job.wait(240) == 0, job.output
    (stall, *_) = job.events("rendezvous.stalled")
    assert stall["seconds"] > HEARTBEAT_TIMEOUT_S, stall
    for bad in ("host.lost", "host.blacklisted", "leader.deposed", "worker.failed"):
        assert not job.events(bad), f"{bad} after the stall:\n{job.output}"
    assert not job.events("generation.formed", number=2)
    assert_every_sample_once(read_logs(log), 2)
