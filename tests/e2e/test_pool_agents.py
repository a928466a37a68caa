"""Hosts that join a pool by connecting (`pool serve --hosts-from-agents`, `pool agent` on each
host): one process per host serves every job placed there. Real pool, real pool agents (each its
own process group: a host), real jobs with their own agents, workers and Gloo rings."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from harness import PRODUCT_SPARES, first_commit_at, read_logs, wait_for
from job_checks import assert_every_sample_once, assert_ranks_agree
from pool_rig import Pool

pytestmark = pytest.mark.slow


def job_agent_pids(pool: Pool, job: str, host: str) -> set[int]:
    """The pid of `job`'s agent on `host`, as the job's rendezvous knows it (empty: none yet)."""
    status = pool.call(f"/jobs/{job}/status")
    return {h["agent_pid"] for h in status["hosts"] if h["name"] == host and h.get("agent_pid")}


def children(pid: int) -> set[int]:
    return {child.pid for child in psutil.Process(pid).children()}


def test_one_pool_agent_per_host_serves_every_job_placed_there_and_a_host_taken_politely_costs_no_step(
        run_job, tmp_path) -> None:
    join = tmp_path / "join.secret"
    pool = Pool(run_job, tmp_path, "--hosts-from-agents", "--join-secret-file", str(join), "--min-resize-interval", "0")
    assert join.stat().st_mode & 0o077 == 0

    def pool_agent(host: str, slots: int, secret_file: str = str(join)):
        return run_job("agent", "--pool", pool.url, "--host", host, "--slots", str(slots), "--secret-file", secret_file,
                       verb="pool", env=PRODUCT_SPARES)  # its jobs' agents keep warm spares

    stranger = tmp_path / "other.secret"
    stranger.write_text("another-secret-another-secret-0\n")
    stranger.chmod(0o600)
    refused = pool_agent("hX", 1, str(stranger))
    assert refused.wait(30) != 0 and "the pool refused host hX" in refused.output and "HTTP 401" in refused.output

    a_host, b_host = pool_agent("hA", 3), pool_agent("hB", 1)
    wait_for(lambda: {h["name"]: h["slots"] for h in pool.call("/hosts")} == {"hA": 3,
                                                                              "hB": 1}, 60, "both hosts joined")
    spawned: set[int] = set()
    try:
        a_stop = tmp_path / "a.stop"  # a trains until told to (after the host was taken)
        a = pool.submit(tmp_path / "a", 2, 4, epochs=1000, samples=240, stop=a_stop)
        pool.wait_job(a, lambda j: j["state"] == "running" and j["size"] == 4, 60, "a on 4 slots")
        wait_for(lambda: first_commit_at(tmp_path / "a", 4), 120, "a training on 4")
        b = pool.submit(tmp_path / "b", 2, 2, epochs=2, samples=64)
        pool.wait_job(b, lambda j: j["state"] == "running", 120, "b running")
        assert pool.job(a)["hosts"] == {"hA": 2} and pool.job(b)["hosts"] == {"hA": 1, "hB": 1}

        def both_on_a_host() -> set[int] | None:  # hA's one pool agent runs a's and b's agents at once
            pids = job_agent_pids(pool, a, "hA") | job_agent_pids(pool, b, "hA")
            spawned.update(children(a_host.proc.pid))
            return pids if len(pids) == 2 and pids <= children(a_host.proc.pid) else None

        wait_for(both_on_a_host, 60, "hA's pool agent running both jobs' agents")
        pool.wait_job(b, lambda j: j["state"] == "succeeded", 180, "b to finish")
        pool.wait_job(a, lambda j: j["size"] == 4, 60, "a grown back to 4")
        # Each job's agent is started once per stay on a host: a's on hB again when it grows back.
        expected = sorted([("hA", a), ("hA", b), ("hB", a), ("hB", b), ("hB", a)])
        wait_for(lambda: sorted((e["host"], e["job"]) for e in a_host.events("pool.agent_starts") +
                                b_host.events("pool.agent_starts")) == expected, 60, "a's agent started on hB again")
        spawned.update(children(a_host.proc.pid) | children(b_host.proc.pid))
        # Each pool agent keeps a job's agent started ahead, its spares warming: later jobs start warm.
        assert any(e["warm"] for e in a_host.events("pool.agent_starts") + b_host.events("pool.agent_starts"))
        assert any(e.get("warm") for e in a_host.events("spare.used") + b_host.events("spare.used"))

        wait_for(lambda: first_commit_at(tmp_path / "a", 4, after=time.time() - 5), 60, "a training on 4 again")
        b_host.proc.send_signal(signal.SIGTERM)  # hB is taken politely: a's worker there leaves at a commit
        assert b_host.wait(60) == 0, b_host.output
        left = time.monotonic()  # it left at once (the pool hears it at its next look), not after --host-timeout (15 s)
        wait_for(lambda: "hB" not in {h["name"] for h in pool.call("/hosts")}, 3, "hB gone from the pool")
        assert time.monotonic() - left < 3
        pool.wait_job(a, lambda j: j["hosts"] == {"hA": 3}, 60, "a on hA alone")
        shrunk_at = time.time()
        wait_for(lambda: first_commit_at(tmp_path / "a", 3, after=shrunk_at), 60, "a training on 3")
        a_stop.touch()
        pool.wait_job(a, lambda j: j["state"] == "succeeded", 300, "a to finish")
    finally:
        for pid in spawned:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    lost = pool.proc.events("host.lost")
    around = [(round(e.get("time", 0) - lost[0]["time"], 3), e.get("job"), e.get("kind"), e.get("host"))
              for e in pool.proc.events() + b_host.events() if abs(e.get("time",
                                                                         0) - lost[0]["time"]) < 3] if lost else []
    assert not lost and not pool.proc.events("pool.host_blacklisted"), around
    assert len(b_host.events("pool.agent_joined")) == 1  # it never lapsed out of the pool and back
    logs = read_logs(tmp_path / "a")
    redone = sum(len(steps) - len(set(steps)) for steps in ([r["step"] for r in records if r["event"] == "begin"]
                                                            for records in logs.values()))
    assert redone == 0  # shrunk for b, grown back, drained off hB: nothing trained twice
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)
