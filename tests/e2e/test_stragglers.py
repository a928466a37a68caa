"""Stragglers with real agents and workers: a host whose CPU share is cut for real (a cgroup, or
stop/continue signals where none can be made) is found from its ranks' step times within 100
steps, and `--stragglers replace` drains it at a commit for a spare host, which raises the job's
steps per second."""

from __future__ import annotations

import pytest
from cpu_share import cpu_share, process_group
from harness import FAST, WORKLOADS, commit_log, scrape, wait_for

pytestmark = pytest.mark.slow


def _rate(rows: list[dict]) -> float:
    """Committed steps per second over `rows` (rank 0's commits)."""
    if len(rows) < 2 or rows[-1]["time"] <= rows[0]["time"]:
        return 0.0
    return (rows[-1]["step"] - rows[0]["step"]) / (rows[-1]["time"] - rows[0]["time"])


def test_a_slowed_host_is_found_and_replaced_by_a_spare(run_job, tmp_path) -> None:
    log = tmp_path / "commits.jsonl"
    job = run_job("-H", "hA:1,hB:1,hC:1", "--min-np", "1", "--max-np", "2", *FAST,
                  "--stragglers", "replace", "--straggler-steps", "30",
                  "python", str(WORKLOADS / "paced_job.py"), "--compute",
                  "200", "--params", "2000", "--commit-log", str(log))
    job.wait_status(lambda s: s["steps"] >= 30 and s["world_size"] == 2, 120, "training on hA and hB")
    busy = {h["name"] for h in job.status()["hosts"] if h["state"] == "active"}
    assert busy == {"hA", "hB"}, busy
    healthy = _rate(commit_log(log)[-20:])

    def slowdowns() -> dict[str, float] | None:  # (the straggler check's measure, each host's, in the metrics)
        shown = {dict(labels)["host"]: value for (name, labels), value in scrape(job.api_url).items()
                 if name == "ringmaster_host_slowdown"}
        return shown if set(shown) == {"hA", "hB"} else None

    assert all(0.5 < slowdown < 2.0 for slowdown in wait_for(slowdowns, 60, "each host's slowdown shown").values())
    agent = next(h["agent_pid"] for h in job.status()["hosts"] if h["name"] == "hB")
    with cpu_share(lambda: process_group(agent), 0.1) as how:
        capped_at = commit_log(log)[-1]["step"]
        found = job.wait_event("host.straggler", 120, host="hB")
        steps_then = job.status()["steps"]
        assert steps_then - capped_at <= 100, (how, capped_at, steps_then, found["message"])
        assert found["slowdown"] >= 1.2 and found["replaced"] is True, found
        slowed = [r for r in commit_log(log) if r["step"] > capped_at + 5]  # (while it straggled)
        drained = job.wait_event("host.drained", 120, host="hB")
        assert drained["outcome"] == "commit", drained
        job.wait_status(lambda s: {h["name"] for h in s["hosts"] if h["state"] == "active"} == {"hA", "hC"}
                        and s["world_size"] == 2, 120, "training on hA and hC")
        replaced_at = job.status()["steps"]  # (status' steps come with heartbeats: they may lag rank 0's)

        def at_two() -> list[dict] | None:
            rows = [r for r in commit_log(log) if r["step"] > replaced_at and r["size"] == 2]
            return rows if len(rows) >= 30 else None

        after = wait_for(at_two, 120, "30 steps on hA and hC")
    slow_rate = _rate(slowed)
    fast_rate = _rate(after)
    verdicts = [(e["host"], e["slowdown"], e["generation"], e["action"]) for e in job.events("host.straggler")]
    assert fast_rate > 1.5 * slow_rate, (how, healthy, slow_rate, fast_rate, verdicts)
