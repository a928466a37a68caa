"""Replicas stay bit-identical through every reset: whole jobs, real workers, real Gloo rings.

The workload is a Horovod elastic script in Horovod's documented style (the learning rate set
by a reset callback from `hvd.size()`, momentum or Adam, a scheduler stepped per epoch). Each
worker logs a SHA-256 of its whole training state, computed by the workload itself, each time
training (re-)enters and at the end: equal digests mean bit-identical replicas.
"""

from __future__ import annotations

import os
import signal

import pytest
from harness import FAST, discovery_script, elastic_job, events, read_logs, write_hosts
from job_checks import assert_every_sample_once, assert_ranks_agree

pytestmark = pytest.mark.slow
BASE_LR, GAMMA = 0.01, 0.7  # the workload's


@pytest.mark.parametrize("optimizer, scheduler", [("momentum", False), ("adam", True)], ids=["momentum-sgd",
                                                                                             "adam-steplr"])
def test_scale_up_and_a_failure_leave_every_rank_identical(run_job, tmp_path, optimizer, scheduler) -> None:
    """The scale-up that used to leave survivors and newcomers with different parameters (the
    survivors ran the lr callback, the newcomers loaded a commit taken before it), followed by
    the kill of a worker in the same run."""
    script, hosts = discovery_script(tmp_path, {"hostA": 2})
    logs_dir, stop = tmp_path / "log", tmp_path / "stop"  # trains until told to (it raced a fixed length under load)
    job = run_job("--min-np", "2", "--max-np", "8", "--host-discovery-script", script, *FAST,
                  *elastic_job(logs_dir, epochs=1000, samples=192, step_time=0.05), "--optimizer", optimizer,
                  "--lr-callback", "--commit-every", "2", *(["--scheduler"] if scheduler else []), "--stop-file", stop)
    job.wait_status(lambda s: s["steps"] >= 4, 120, "training on hostA")
    write_hosts(hosts, {"hostA": 2, "hostB": 2})
    grown = job.wait_status(lambda s: s["world_size"] == 4, 120, "the world to grow to 4")
    steps = grown["steps"]
    grown = job.wait_status(lambda s: s["steps"] >= steps + 4, 60, "training at size 4")
    victim = next(w for w in grown["workers"] if w["host"] == "hostB" and w["rank"] is not None)
    os.kill(victim["pid"], signal.SIGKILL)
    after = job.wait_status(lambda s: s["generation"] >= grown["generation"] + 1, 60,
                            "a ring without the killed worker")
    job.wait_status(lambda s: s["steps"] >= after["steps"] + 4, 60, "training after the failure")
    stop.touch()
    assert job.wait(240) == 0, job.output

    logs = read_logs(logs_dir)
    assert_ranks_agree(logs)
    assert_every_sample_once(logs)
    for record in events(logs, "synced"):
        # the callback's value on every rank, newcomers included (the scheduler decays it per epoch)
        decay = GAMMA ** record["epoch"] if scheduler else 1.0
        assert record["lr"] == pytest.approx(BASE_LR * record["size"] * decay), record
    resets = events(logs, "reset")
    newcomers = {r["worker"] for r in resets if r["worker"].startswith("hostB")}
    assert newcomers, "newcomers never ran the reset callbacks"
    assert not job.events("replicas.diverged"), "the replicas were made identical by the guard, not by the sync"
    assert job.events("state.rolled_back")


def test_replica_guard_heals_a_rank_dependent_reset_callback(run_job, tmp_path) -> None:
    """A reset callback that makes the lr depend on the rank: the guard names the entry and the
    ranks, syncs every rank from rank 0's live state, and the job ends with identical replicas."""
    logs_dir = tmp_path / "log"
    job = run_job("--min-np", "2", "-H", "hostA:2,hostB:1", *FAST,
                  *elastic_job(logs_dir, epochs=3, samples=48), "--optimizer", "momentum", "--skew-callback")
    job.wait_status(lambda s: s["world_size"] == 3 and s["steps"] >= 3, 120, "3 workers training")
    job.kill_host("hostB")
    assert job.wait(180) == 0, job.output
    logs = read_logs(logs_dir)
    assert_ranks_agree(logs)
    assert [e["differences"] for e in job.events("replicas.diverged")][:1] == ["rank 1: optimizer"]
    assert job.events("replicas.healed", generation=2)


def test_replica_guard_stops_a_job_whose_ranks_cannot_be_made_equal(run_job, tmp_path) -> None:
    """State that takes the rank of whoever loads it (a plain attribute stamped on load) cannot
    be synced: the guard stops the workers with the reason instead of training on."""
    job = run_job("-np", "2", "--crash-loop-limit", "1", *elastic_job(tmp_path / "log", epochs=1), "--rank-stamp")
    assert job.wait(120) == 1, job.output
    assert "ReplicasDivergedError: in generation 1 the live state still differs from rank 0's after a second sync " \
           "(rank 1: stamp)" in job.output
    assert not events(read_logs(tmp_path / "log"), "synced"), "training ran on unequal replicas"
