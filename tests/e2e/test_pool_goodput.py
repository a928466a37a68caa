"""`--policy goodput` on a real pool: from the step times their workers send, the pool learns that
one job is bound by its ring (a large model, little compute) and the other by its compute (a step
cost that runs in parallel), and moves slots from the first to the second, at their commits."""

from __future__ import annotations

import pathlib

import pytest
from harness import WORKLOADS, commit_log, wait_for
from pool_rig import Pool

pytestmark = pytest.mark.slow


def paced(log: pathlib.Path, params: int, wait: float) -> list[str]:
    return ["python", str(WORKLOADS / "paced_job.py"), "--params", str(params), "--wait", str(wait),
            "--commit-log", str(log)]


def test_goodput_moves_slots_from_a_ring_bound_job_to_a_compute_bound_one(run_job, tmp_path) -> None:
    pool = Pool(run_job, tmp_path, "-H", "hA:1,hB:1,hC:1,hD:1", "--policy", "goodput",
                "--min-resize-interval", "10", "--resize-cost", "0.1")
    ring_log, compute_log = tmp_path / "ring.jsonl", tmp_path / "compute.jsonl"
    ring = str(pool.call("/jobs", {"command": paced(ring_log, params=2_000_000, wait=0.0), "min_np": 1, "max_np": 3,
                                   "name": "ring-bound"})["id"])
    compute = str(pool.call("/jobs", {"command": paced(compute_log, params=1000, wait=0.1), "min_np": 1, "max_np": 3,
                                      "name": "compute-bound"})["id"])
    pool.wait_job(compute, lambda j: j["state"] == "running" and j["size"] == 3, 240,
                  "the compute-bound job on 3 slots")
    ring_job = pool.wait_job(ring, lambda j: j["state"] == "running" and j["size"] == 1, 60, "the ring-bound job on 1")
    assert "speed other jobs up more" in ring_job["reason"] or ring_job["reason"].startswith("running"), ring_job
    # (the API may say the new size a moment before the pool's log line is read: waited for)
    wait_for(lambda: [e for e in pool.proc.events("pool.job_resized", job=ring) if e["size"] < e["before"]], 30,
             "the ring-bound job's shrink in the pool's log")
    grown = wait_for(lambda: [e for e in pool.proc.events("pool.job_resized", job=compute) if e["size"] > e["before"]],
                     30, "the compute-bound job's growth in the pool's log")
    assert grown[-1]["size"] == 3, pool.proc.events("pool.job_resized")
    # The pool's size is its placement; each job takes it at its next commit, which may come later.
    for log, size in ((ring_log, 1), (compute_log, 3)):
        wait_for(lambda: any(entry["size"] == size for entry in commit_log(log)), 60,
                 f"a commit on {size} in {log.name}")
        steps = [entry["step"] for entry in commit_log(log)]  # resized at commits: no step was trained twice
        assert len(steps) == len(set(steps)), (log.name, steps[-20:])
    assert not pool.proc.events("job.failed") and not pool.proc.events("generation.over")
