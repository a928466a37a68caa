"""Warm spares in real jobs (with the worker template off: where a worker cannot be forked): a
newcomer on a running host's agent becomes its warm spare; and, with the template on, a job that
ends while newcomers still start up does not wait for them."""

from __future__ import annotations

import pytest
from harness import FAST, discovery_script, elastic_job, events, first_commit_at, read_logs, wait_for, write_hosts
from job_checks import assert_every_sample_once, assert_ranks_agree

from ringmaster.settings import FORK_WORKERS_ENV

pytestmark = pytest.mark.slow


def test_a_newcomer_on_a_running_host_becomes_its_warm_spare(run_job, tmp_path) -> None:
    script, hosts = discovery_script(tmp_path, {"hostA": 2})
    logs_dir, stop = tmp_path / "log", tmp_path / "stop"  # trains until told to, once the newcomer is in
    job = run_job("--min-np", "1", "--max-np", "3", "--host-discovery-script", script, "--spares", "1", *FAST,
                  *elastic_job(logs_dir, epochs=1000, samples=192), "--timestamps", "--stop-file", stop,
                  env={"OMP_NUM_THREADS": None, FORK_WORKERS_ENV: "0"})
    job.wait_status(lambda s: s["world_size"] == 2 and s["steps"] >= 3, 120, "a ring of two training")
    ready = job.wait_event("spare.ready", 120, host="hostA")  # started once the first workers' start-up was over
    started = job.events("process.started", host="hostA")
    assert ready["time"] - max(e["time"] for e in started) >= 10.0  # fresh_hold_s
    write_hosts(hosts, {"hostA": 3})  # a slot more on the host whose agent (and spare) runs
    job.wait_event("generation.formed", 120, size=3)
    wait_for(lambda: first_commit_at(logs_dir, 3), 120, "a step at size 3")
    stop.touch()
    assert job.wait(240) == 0, job.output
    used = job.events("spare.used")
    assert [(e["worker"], e["warm"]) for e in used] == [("hostA/3", True)], job.output
    assert not job.events("spare.unfit")
    logs = read_logs(logs_dir)
    assert {r["size"] for r in events(logs, "synced") if r["generation"] >= 2} == {3}
    # Emulated hosts share this machine: one intra-op thread a worker, the spare-born one too
    # (its OpenMP had read an environment without OMP_NUM_THREADS).
    assert {r["threads"] for r in events(logs, "synced")} == {1}, job.output
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)


def test_no_spares_when_told_and_a_job_ending_while_newcomers_start_does_not_wait_for_them(run_job, tmp_path) -> None:
    script, hosts = discovery_script(tmp_path, {"hostA": 2})
    logs_dir = tmp_path / "log"
    job = run_job("--min-np", "1", "--max-np", "4", "--host-discovery-script", script, "--spares", "0", *FAST,
                  *elastic_job(logs_dir, epochs=2, samples=96), "--newcomer-delay", "120",
                  env={"OMP_NUM_THREADS": "2"})  # the user's own thread count stands
    job.wait_status(lambda s: s["world_size"] == 2 and s["steps"] >= 3, 120, "a ring of two training")
    write_hosts(hosts, {"hostA": 2, "hostB": 2})  # newcomers that take 120 s to build their model
    job.wait_event("process.started", 60, host="hostB")
    assert job.wait(100) == 0, job.output  # far less than the newcomers' 120 s
    newcomers = {e["worker"] for e in job.events("worker.starting", host="hostB")}
    retired = {e["worker"] for e in job.events("worker.retiring")}
    assert len(newcomers) == 2 and newcomers <= retired, job.output
    ended = job.events("job.finishing")[0]["time"]
    stopped = [e["time"] - ended for e in job.events("worker.stopped") if e["worker"] in newcomers]
    assert len(stopped) == 2 and max(stopped) < 10, stopped  # stopped as the job finished, not waited for
    assert not job.events("spare.used")
    assert newcomers <= {e["worker"] for e in job.events("template.forked")}, job.output
    assert {r["size"] for r in events(read_logs(logs_dir), "done")} == {2}
    assert {r["threads"] for r in events(read_logs(logs_dir), "synced")} == {2}
