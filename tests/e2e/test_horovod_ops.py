"""Horovod's whole op API on real jobs: every name as a Horovod script calls it on three workers
of two hosts, an async operation whose peer is SIGKILLed, and process sets through a failure
and a scale-up (the semantics per op and dtype are in tests/unit/train/test_operations.py)."""

from __future__ import annotations

import json
import os
import signal

import pytest
from harness import FAST, WORKLOADS, discovery_script, wait_for, write_hosts

pytestmark = pytest.mark.slow
SCRIPT = str(WORKLOADS / "horovod_ops.py")


def test_every_horovod_op_name_works_as_horovod_s_on_three_workers(run_job, tmp_path) -> None:
    job = run_job("-H", "hostA:2,hostB:1", "python", SCRIPT, "api", tmp_path)
    assert job.wait(180) == 0, job.output
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(3)]
    not_initialized = "ValueError: Ringmaster has not been initialized; call hvd.init() first"
    for r, got in enumerate(results):
        assert got["probes"] == [True, True, False, False, False, False, 0, False, False], got["probes"]
        assert got["mpi_threads"].startswith("ValueError: Horovod MPI is not enabled")
        assert got["int_prescale"] == [3, 6]  # trunc(0.5 * [3, 5]) = [1, 2] on each of 3 ranks
        assert got["product"] == [6.0] and got["min_int8"] == [-1]
        assert got["async"] == [[float(3 * k + 3)] * 3 for k in reversed(range(8))]
        assert got["duplicate_name"].startswith("ValueError: a collective named 'twice' is still in flight")
        assert got["poll_after"].startswith("ValueError: handle")
        assert got["polled"] == [2.0, 2.0]
        assert got["allgather_async"] == [0, 1, 1, 2, 2, 2]
        assert got["broadcast_async"] == [1] and got["broadcast_async_"] == [2.0]
        assert got["grouped_async"] == [[3.0, 3.0], [3]]
        # rank s sent j+1 rows [s, j] to rank j
        assert got["alltoall"] == [[s, r] for s in range(3) for _ in range(r + 1)]
        assert got["alltoall_received"] == [r + 1] * 3
        assert got["alltoall_async"] == [got["alltoall"], got["alltoall_received"]]
        assert got["alltoall_even"] == [r, 10 + r, 20 + r]
        # the sum over ranks of arange(7) + rank is 3 * arange(7) + 3; 7 rows split 3, 2, 2
        assert got["reducescatter"] == [[3.0, 6.0, 9.0], [12.0, 15.0], [18.0, 21.0]][r]
        assert got["reducescatter_avg"] == [1.0, 1.0]
        assert got["grouped_reducescatter"] == [[3.0], [[3.0, 3.0], [3.0, 3.0]] if r == 0 else [[3.0, 3.0]]]
        assert got["grouped_allgather"] == [[0, 1, 2], [[1.0, 1.0]] * 3]
        assert got["allreduce_grad"] == [6.0] and got["allgather_grad"] == [r + 1.0] * 2
        assert got["mismatch"].startswith("CollectiveMismatchError: allreduce: rank ") and "dim0" in got["mismatch"]
        assert got["after_mismatch"] == [3.0]
        assert got["bad_splits"].startswith("ValueError: alltoall splits sum to 27")
        assert got["bad_op"].startswith("ValueError: unknown reduction op 'median'")
        assert got["duplicate_set"].startswith("ValueError: Attempted to add a duplicate process set")
        assert got["set_ids"] == [0, 2]  # init's set is 1
        assert "names rank 3 but the job has 3 workers now" in got["set_too_big"]
        assert got["removed"] == [True, None, False] and "is not registered" in got["removed_use"]
        assert got["barrier_set"]
        assert got["syncbn_error"] < 1e-5 and got["syncbn_grad_error"] < 1e-4 and got["syncbn_running_error"] < 1e-5, (
            got
        )
        assert got["timeline_bad_folder"].startswith("ValueError: start_timeline('/no/such/folder/t.json')")
        assert got["reinit"] == [not_initialized, 3.0] * 10
        assert "is not registered" in got["sets_after_shutdown"]
    for r in (0, 1):
        assert results[r]["set_sum"] == [3.0] and results[r]["set_rank"] == [r, 2, True]
        assert results[r]["set_bcast"] == [1] and results[r]["set_async"] == [0, 1]
    assert "is not part of ProcessSet(process_set_id=2, ranks=[0, 1]" in results[2]["not_member"]
    assert results[2]["set_rank"][1:] == [2, False]
    assert results[0]["timeline_names"] == ["timed"]


def test_an_async_op_whose_peer_is_sigkilled_raises_from_synchronize(run_job, tmp_path) -> None:
    job = run_job("--min-np", "1", "--max-np", "3", "-H", "hostA:3", "python", SCRIPT, "async-kill", tmp_path)
    assert job.wait(120) == 0, job.output
    for rank in (0, 2):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        assert got["outcomes"] == ["HorovodInternalError"] * 2, got
        assert got["seconds"] < 30, got  # the ring's failure, not --collective-timeout
    assert not (tmp_path / "1.json").exists()


def _records(folder) -> list[dict]:
    found = []
    for path in folder.glob("*.log"):
        found += [json.loads(line) for line in path.read_text().splitlines(keepends=True)
                  if line.endswith("\n") and line.strip()]  # (a line not yet ended is read next time)
    return found


def test_process_sets_are_rebuilt_on_each_ring_through_a_failure_and_a_scale_up(run_job, tmp_path) -> None:
    """Sets [0, 1] and [0, 2]: at size 3 both sum; after a worker dies (size 2) [0, 2] cannot
    exist and says so while [0, 1] goes on; when a host is added (size 3) both sum again."""
    script, hosts = discovery_script(tmp_path, {"hostA": 2, "hostB": 1})
    out = tmp_path / "out"
    out.mkdir()
    job = run_job("--min-np", "2", "--max-np", "3", "--host-discovery-script", script, *FAST, "python", SCRIPT,
                  "sets", out, "100000")
    status = job.wait_status(lambda s: s["world_size"] == 3 and s["steps"] >= 3, 120, "3 workers training")
    write_hosts(hosts, {"hostA": 2})
    victim = next(w for w in status["workers"] if w["host"] == "hostB" and w["rank"] is not None)
    os.kill(victim["pid"], signal.SIGKILL)
    job.wait_status(lambda s: s["world_size"] == 2, 120, "the ring without hostB")
    wait_for(lambda: any(r["size"] == 2 and "spread" in r for r in _records(out)), 60, "a step at size 2")
    write_hosts(hosts, {"hostA": 2, "hostC": 1})
    job.wait_status(lambda s: s["world_size"] == 3, 120, "hostC's worker in the ring")
    wait_for(lambda: sum(1 for r in _records(out) if r["size"] == 3 and r["rank"] == 2) >= 6, 60,
             "steps at size 3 again")
    (out / "stop").touch()
    assert job.wait(120) == 0, job.output
    records = _records(out)
    at_three = [r for r in records if r["size"] == 3]
    at_two = [r for r in records if r["size"] == 2]
    assert at_three and at_two
    for r in at_three:
        if r["rank"] in (0, 1):
            assert r["low"] == 3.0, r
        if r["rank"] in (0, 2):
            assert r["spread"] == 4.0, r
    for r in at_two:
        assert r["low"] == 3.0, r
        if r["rank"] == 0:
            assert "names rank 2 but the job has 2 workers now" in r["spread"], r
