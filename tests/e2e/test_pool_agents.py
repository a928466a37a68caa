"""Hosts that join a pool by connecting (`pool serve --hosts-from-agents`, `pool agent` on each
host): one process per host serves every job placed there. Real pool, real pool agents (each its
own process group: a host), real jobs with their own agents, workers and Gloo rings."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from harness import read_logs, wait_for
from job_checks import assert_every_sample_once, assert_ranks_agree
from pool_rig import Pool

pytestmark = pytest.mark.slow


def job_agents(daemon_pid: int) -> dict[str, int]:
    """The jobs' agents a pool agent runs: rendezvous address -> pid."""
    found = {}
    for child in psutil.Process(daemon_pid).children():
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if "ringmaster.worker.agent" in argv:
            found[argv[argv.index("--rendezvous") + 1]] = child.pid
    return found


def test_one_pool_agent_per_host_serves_every_job_placed_there_and_a_host_taken_politely_costs_no_step(
        run_job, tmp_path) -> None:
    join = tmp_path / "join.secret"
    pool = Pool(run_job, tmp_path, "--hosts-from-agents", "--join-secret-file", str(join), "--host-timeout", "6",
                "--min-resize-interval", "0")
    assert join.stat().st_mode & 0o077 == 0

    def pool_agent(host: str, slots: int, secret_file: str = str(join)):
        return run_job("agent", "--pool", pool.url, "--host", host, "--slots", str(slots), "--secret-file", secret_file,
                       verb="pool")

    stranger = tmp_path / "other.secret"
    stranger.write_text("another-secret-another-secret-0\n")
    stranger.chmod(0o600)
    refused = pool_agent("hX", 1, str(stranger))
    assert refused.wait(30) != 0 and "the pool refused host hX" in refused.output and "HTTP 401" in refused.output

    a_host, b_host = pool_agent("hA", 3), pool_agent("hB", 1)
    wait_for(lambda: {h["name"]: h["slots"] for h in pool.call("/hosts")} == {"hA": 3, "hB": 1}, 60, "both hosts joined")
    spawned: set[int] = set()
    try:
        a = pool.submit(tmp_path / "a", 2, 4, epochs=12, samples=240)
        pool.wait_job(a, lambda j: j["state"] == "running" and j["size"] == 4, 60, "a on 4 slots")
        wait_for(lambda: any(r["event"] == "commit" and r["size"] == 4 for rs in read_logs(tmp_path / "a").values()
                             for r in rs), 120, "a training on 4")
        b = pool.submit(tmp_path / "b", 2, 2, epochs=2, samples=64)
        pool.wait_job(b, lambda j: j["state"] == "running", 120, "b running")
        assert pool.job(a)["hosts"] == {"hA": 2} and pool.job(b)["hosts"] == {"hA": 1, "hB": 1}

        def both_on_a_host() -> dict[str, int] | None:  # hA's one pool agent runs a's and b's agents at once
            agents = job_agents(a_host.proc.pid)
            spawned.update(agents.values())
            return agents if len(agents) == 2 else None

        wait_for(both_on_a_host, 60, "hA's pool agent running both jobs' agents")
        pool.wait_job(b, lambda j: j["state"] == "succeeded", 180, "b to finish")
        pool.wait_job(a, lambda j: j["size"] == 4, 60, "a grown back to 4")
        # Each job's agent is started once per stay on a host: a's on hB again when it grows back.
        expected = sorted([("hA", a), ("hA", b), ("hB", a), ("hB", b), ("hB", a)])
        wait_for(lambda: sorted((e["host"], e["job"]) for e in a_host.events("pool.agent_starts") +
                                b_host.events("pool.agent_starts")) == expected, 60, "a's agent started on hB again")
        spawned.update(job_agents(b_host.proc.pid).values())

        wait_for(lambda: any(r["event"] == "commit" and r["size"] == 4 and r["time"] > time.time() - 5
                             for rs in read_logs(tmp_path / "a").values() for r in rs), 60, "a training on 4 again")
        b_host.proc.send_signal(signal.SIGTERM)  # hB is taken politely: a's worker there leaves at a commit
        assert b_host.wait(60) == 0, b_host.output
        left = time.monotonic()  # it left at once (the pool hears it at its next look), not after --host-timeout 6
        wait_for(lambda: "hB" not in {h["name"] for h in pool.call("/hosts")}, 3, "hB gone from the pool")
        assert time.monotonic() - left < 3
        pool.wait_job(a, lambda j: j["hosts"] == {"hA": 3}, 60, "a on hA alone")
        pool.wait_job(a, lambda j: j["state"] == "succeeded", 300, "a to finish")
    finally:
        for pid in spawned:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    assert not pool.proc.events("host.lost") and not pool.proc.events("pool.host_blacklisted")
    logs = read_logs(tmp_path / "a")
    redone = sum(len(steps) - len(set(steps)) for steps in ([r["step"] for r in records if r["event"] == "begin"]
                                                            for records in logs.values()))
    assert redone == 0  # shrunk for b, grown back, drained off hB: nothing trained twice
    assert_every_sample_once(logs, 12)
    assert_ranks_agree(logs)
