"""A worker killed while the only other holder of the commit shares its host: nothing is lost.

The chaos run in CI found it: a worker was SIGKILLed just after a ring formed with two newcomers,
before they had received the commit. Horovod's rule blacklists the dead worker's host, which
retired its host-mate, the last worker holding the commit, and the job went on from the
newcomers' initial state. Here the same moment is made on purpose, with real processes: hostB's
newcomers exist (starting, warming up or receiving the state) but hold no commit when hostA's
rank 0 is killed; hostA must be kept and its survivor must hand the commit on.
"""

from __future__ import annotations

import os
import signal

import pytest
from chaos import assert_no_committed_step_lost
from harness import FAST, discovery_script, elastic_job, events, read_logs, write_hosts
from job_checks import assert_every_sample_once, assert_ranks_agree

pytestmark = pytest.mark.slow


def test_the_last_holder_of_the_commit_is_kept_when_its_host_mate_dies(run_job, tmp_path) -> None:
    script, hosts = discovery_script(tmp_path, {"hostA": 2})
    logs_dir, stop = tmp_path / "log", tmp_path / "stop"
    job = run_job("--min-np", "2", "--max-np", "4", "--host-discovery-script", script, *FAST,
                  *elastic_job(logs_dir, epochs=100000, samples=96, step_time=0.02), "--stop-file", str(stop),
                  "--timestamps")
    status = job.wait_status(lambda s: s["steps"] >= 10, 120, "training on hostA")
    (rank0,) = [w for w in status["workers"] if w["rank"] == 0]
    write_hosts(hosts, {"hostA": 2, "hostB": 2})
    job.wait_status(lambda s: sum(1 for w in s["workers"] if w["host"] == "hostB") == 2, 60, "hostB's newcomers")
    os.kill(rank0["pid"], signal.SIGKILL)  # the newcomers hold no commit yet: hostA/1 alone holds it
    kept = job.wait_event("host.kept_for_commit", 60, host="hostA")
    assert "hostA/" in str(kept["workers"]) and rank0["worker_id"] not in kept["workers"], kept
    job.wait_status(lambda s: s["world_size"] >= 3 and s["steps"] >= status["steps"] + 10, 120,
                    "training after the kill")
    stop.touch()
    assert job.wait(180) == 0, job.output
    logs = read_logs(logs_dir)
    assert_no_committed_step_lost(logs)
    assert not job.events("commits.lost"), job.story()
    assert not job.events("host.blacklisted", host="hostA"), job.story()
    assert_every_sample_once(logs)
    assert_ranks_agree(logs, cut_short={1, 2})
    assert len({r["checksum"] for r in events(logs, "done")}) == 1
