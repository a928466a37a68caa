"""The pool itself stalls (a real SIGSTOP of its process for twice its hosts' timeout, then
SIGCONT), as a long GC pause, swapping or a starved machine would stop it. Its hosts' pool agents
poll it meanwhile, and their polls wait unread in its sockets. When it runs again it must not count
its hosts silent for the time it did not listen: no host leaves the pool, no job loses a host, and
training goes on."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from harness import WORKLOADS, commit_log, wait_for
from pool_rig import Pool

pytestmark = pytest.mark.slow

HOST_TIMEOUT_S = 3.0
STALL_S = 2 * HOST_TIMEOUT_S
#: Past the time the pool holds a poll (a third of the host timeout): the pool agents' polls
#: in flight have been answered, so their next ones reach the pool while it is stopped.
ANSWERED_S = HOST_TIMEOUT_S / 2


def test_a_pool_stopped_longer_than_its_host_timeout_keeps_its_hosts_and_its_job(run_job, tmp_path) -> None:
    pool = Pool(run_job, tmp_path, "-H", "hA:1,hB:1", "--host-timeout", str(HOST_TIMEOUT_S))
    log = tmp_path / "commits.jsonl"
    job = str(pool.call("/jobs", {"command": ["python", str(WORKLOADS / "paced_job.py"), "--wait", "0.05",
                                              "--commit-log", str(log)], "min_np": 1, "max_np": 2})["id"])
    pool.wait_job(job, lambda j: j["state"] == "running" and j["size"] == 2, 120, "the job on 2 slots")
    wait_for(lambda: sum(entry["size"] == 2 for entry in commit_log(log)) >= 3, 120, "commits on 2 workers")
    agents = [p for p in psutil.Process(pool.proc.proc.pid).children() if "agent" in p.cmdline()]
    assert len(agents) == 2, [p.cmdline() for p in agents]
    # The faults are the stalls themselves. First the pool agents stop, so that no poll is held
    # open when the pool stops (a held poll, answered when the pool runs again, would count as
    # heard at once); then the pool stops, and the agents' next polls wait in its sockets.
    for agent in agents:
        agent.suspend()
    try:
        time.sleep(ANSWERED_S)
        os.kill(pool.proc.proc.pid, signal.SIGSTOP)
        try:
            for agent in agents:
                agent.resume()
            time.sleep(STALL_S)
        finally:
            os.kill(pool.proc.proc.pid, signal.SIGCONT)
    finally:
        for agent in agents:
            agent.resume()
    before = len(commit_log(log))
    wait_for(lambda: len(commit_log(log)) >= before + 5, 60, "five more commits after the stall")
    for bad in ("pool.host_lapsed", "host.lost", "pool.host_blacklisted", "generation.over", "pool.agent_stops"):
        assert not pool.proc.events(bad), f"{bad} after the stall:\n{pool.proc.output[-5000:]}"
    assert pool.job(job)["size"] == 2
    (stall, *_) = pool.proc.events("pool.stalled")
    assert stall["seconds"] >= HOST_TIMEOUT_S, stall
