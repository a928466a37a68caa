"""Horovod's own elastic PyTorch scenarios, run with `ringmaster run` as its users would.

The scenarios and what they expect (world sizes, the rank each epoch's rank 0 had when its
process started, host names, how often the training function was entered, exit statuses) are
those of Horovod's integration tests (test/integration/elastic_common.py); the training script
is Horovod's with only its import changed (workloads/horovod_elastic_torch_main.py). As there, a
discovery script derives the current epoch from the number of lines rank 0 has logged, and the
hosts `localhost` and `127.0.0.1` are two hosts (emulated here by name, one agent each).
"""

from __future__ import annotations

import json
import pathlib

import pytest
from harness import WORKLOADS, Job

pytestmark = pytest.mark.slow

#: Horovod's tests poll discovery every 10 ms; a tenth of a second is plenty here. Newcomers
#: that rank 0 waits for are waited for up to --start-timeout (Horovod's default: 30 s); on a
#: loaded 2-core machine a new host's first workers take 5-20 s to import torch.
FLAGS = ["--discovery-interval", "0.1", "--start-timeout", "60"]
#: Horovod's own script, unchanged but its import (rank 0 polls `state._host_messages.empty()`
#: for up to 3 s after each discovery change, as Horovod's tests run it).
SCRIPT = WORKLOADS / "horovod_elastic_torch_main.py"
#: Horovod's failure message, which ours carries too.
NON_ZERO = "one or more processes exited with non-zero status"

Schedule = list[tuple[int | None, list[str]]]


def write_discovery_script(path: pathlib.Path, logfile: pathlib.Path, schedule: Schedule) -> pathlib.Path:
    """Print the hosts the schedule gives for the current epoch (= lines in the log so far);
    the entry with epoch None applies to every other epoch."""
    lines = ["#!/bin/bash", "epoch=0", f'if [ -f "{logfile}" ]; then epoch=$(wc -l < "{logfile}" | tr -d "[:space:]"); '
                                       'fi']
    default = next((hosts for epoch, hosts in schedule if epoch is None), [])
    lines.append('case "$epoch" in')
    for epoch, hosts in schedule:
        if epoch is not None:
            lines.append(f"  {epoch}) " + "; ".join(f"echo {h}" for h in hosts) + " ;;")
    lines.append("  *) " + ("; ".join(f"echo {h}" for h in default) or "true") + " ;;")
    lines.append("esac")
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def run_scenario(run_job, tmp_path: pathlib.Path, *, schedule: Schedule | None = None, hosts: str | None = None,
                 exit_schedule: dict | None = None, exit_mode: str = "exception", np: int = 2, min_np: int = 2,
                 max_np: int = 4, extra: list[str] | None = None, epochs: int | None = None,
                 epoch_wait: float | None = None, log_level: str = "DEBUG",
                 timeout_s: float = 150) -> tuple[int, list[dict], Job]:
    """Run one scenario as horovodrun's flags would; returns (exit status, rank 0's epoch lines, the job)."""
    logfile = tmp_path / "log.jsonl"
    args = ["-np", np, "--min-num-proc", min_np, "--log-level", log_level, *FLAGS, *(extra or [])]
    if hosts is not None:
        args += ["-H", hosts]
    else:
        assert schedule is not None
        script = write_discovery_script(tmp_path / "discover.sh", logfile, schedule)
        args += ["--host-discovery-script", script, "--max-num-proc", max_np]
    args += ["python", SCRIPT, "--logfile", logfile]
    if schedule is not None:
        args += ["--discovery-schedule", json.dumps(schedule)]
    if exit_schedule:
        args += ["--exit-schedule", json.dumps(exit_schedule), "--exit-mode", exit_mode]
    if epochs is not None:
        args += ["--epochs", epochs]
    if epoch_wait is not None:
        args += ["--epoch-wait", epoch_wait]
    job = run_job(*args)
    code = job.wait(timeout_s)
    results = [json.loads(line) for line in logfile.read_text().splitlines()] if logfile.exists() else []
    return code, results, job


def fields(results: list[dict], *names: str) -> list[tuple]:
    return [tuple(r[n] for n in names) for r in results]


@pytest.mark.parametrize("slots, np, min_np, max_np", [(2, 2, 2, 4), (1, 1, 1, 2)])
def test_hosts_added_and_removed(run_job, tmp_path, slots, np, min_np, max_np) -> None:
    schedule: Schedule = [(0, [f"localhost:{slots}"]), (1, [f"localhost:{slots}", f"127.0.0.1:{slots}"]),
                          (None, [f"127.0.0.1:{slots}"])]
    code, results, job = run_scenario(run_job, tmp_path, schedule=schedule, np=np, min_np=min_np, max_np=max_np)
    assert code == 0, job.output
    assert fields(results, "start_rank", "size", "hostname") == [
        (0, slots, "localhost"), (0, slots * 2, "localhost"), (slots, slots, "127.0.0.1")], job.output
    assert results[2]["rendezvous"] == 3
    assert job.wait_event("job.summary")["resets"] == 2


def test_single_rank_failure(run_job, tmp_path) -> None:
    """Rank 0 raises in epoch 1: its host is blacklisted (its other worker leaves too), the two
    workers of the other host go on in one reset. (Horovod runs this and the next scenario with
    an exception and with a kill; here this one raises and the next one is killed.)"""
    code, results, job = run_scenario(run_job, tmp_path, schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
                                         exit_schedule={str((1, 0)): [0]}, exit_mode="exception")
    assert code == 0, job.output
    assert fields(results, "start_rank", "size", "rendezvous") == [(0, 4, 1), (2, 2, 2), (2, 2, 2)], job.output
    assert job.events("host.blacklisted", host="localhost", cooldown_s=None)
    assert job.wait_event("job.summary")["resets"] == 1, f"{job.story()}\n{job.output}"
    # (the survivors were placed in the next ring unasked: `GenerationOver.rejoin`, no Ready needed)
    assert job.events("worker.connected", worker="127.0.0.1/3")  # --log-level DEBUG


def test_fault_tolerance_without_scaling(run_job, tmp_path) -> None:
    """Fixed hosts (-H with --min-np: elastic, at most every slot); rank 0 is on the first
    listed host and is killed in epoch 1."""
    code, results, job = run_scenario(run_job, tmp_path, hosts="localhost:2,127.0.0.1:2",
                                         exit_schedule={str((1, 0)): [0]}, exit_mode="kill")
    assert code == 0, job.output
    assert fields(results, "start_rank", "size", "rendezvous") == [(0, 4, 1), (2, 2, 2), (2, 2, 2)], job.output
    assert results[0]["hostname"] == "localhost" and results[1]["hostname"] == "127.0.0.1"


@pytest.mark.parametrize("failing", [[0, 1, 2, 3], [0, 2]], ids=["all-ranks", "one-rank-per-host"])
def test_every_host_blacklisted_fails_the_job(run_job, tmp_path, failing) -> None:
    code, results, job = run_scenario(run_job, tmp_path, schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
                                         exit_schedule={str((1, 0)): failing})
    assert code == 1, job.output
    (failed,) = job.events("job.failed")
    assert failed["reason"].startswith("every host is blacklisted") and NON_ZERO in failed["reason"]
    assert len(results) == 1  # epoch 0 only
    # No restart on a blacklisted host. (A failing rank that is slower than the first to fail may
    # not have reached its failure when the first one's generation ends: the next generation forms
    # on the hosts not yet blacklisted, and it fails there.)
    blacklisted: set[str] = set()
    for event in job.events():
        if event.get("kind") == "host.blacklisted":
            blacklisted.add(event["host"])
        elif event.get("kind") == "generation.formed":
            assert not blacklisted & set(event["hosts"]), (event["message"], blacklisted)
    assert blacklisted == {"localhost", "127.0.0.1"}


def test_min_hosts_timeout(run_job, tmp_path) -> None:
    code, _, job = run_scenario(run_job, tmp_path, schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
                                   exit_schedule={str((1, 0)): [0]}, np=4, min_np=4, extra=["--elastic-timeout", "1"],
                                   log_level="WARNING")
    assert code == 1, job.output
    assert job.events("host.blacklisted", host="localhost")
    assert not job.events("generation.formed")  # an INFO event, not printed at --log-level WARNING
    (failed,) = job.events("job.failed")
    assert "needs at least 4 workers (--min-np) but had only 2 for 1 s (--elastic-timeout)" in failed["reason"]


@pytest.mark.parametrize("limit", [1, 2])
def test_reset_limit(run_job, tmp_path, limit) -> None:
    schedule: Schedule = [(0, ["localhost:2"]), (1, ["localhost:2", "127.0.0.1:2"]), (None, ["127.0.0.1:2"])]
    code, results, job = run_scenario(run_job, tmp_path, schedule=schedule, extra=["--reset-limit", str(limit)])
    if limit == 1:
        assert code == 1, job.output
        assert "reset 2 is needed but --reset-limit is 1" in job.events("job.failed")[0]["reason"]
    else:
        assert code == 0, job.output
        assert len(results) == 3


def test_blacklisted_host_stays_out_for_its_cooldown(run_job, tmp_path) -> None:
    """Horovod's resurrection scenario: a host blacklisted with a cooldown of 1-2 s stays out
    while the remaining epochs (0.25 s each) run, and the job needs no other reset."""
    code, results, job = run_scenario(
        run_job, tmp_path, schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exit_schedule={str((1, 0)): [3], str((3, 0)): [3]}, extra=["--blacklist-cooldown-range", "1", "2"],
        epochs=5, epoch_wait=0.25,
    )
    assert code == 0, job.output
    assert len(results) == 5
    assert fields(results, "start_rank", "size", "rendezvous") == [(0, 4, 1)] + [(0, 2, 2)] * 4, job.output
    assert [e for e in job.events("host.blacklisted", host="127.0.0.1") if e["cooldown_s"] is not None]
