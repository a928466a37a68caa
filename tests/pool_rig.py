"""A pool under test (`ringmaster pool serve` as a process) and what tests read of its jobs."""

from __future__ import annotations

import json
import pathlib
import urllib.request
from typing import Any

from harness import SECRET, WORKLOADS, Job, read_logs, wait_for

AUTH = {"Authorization": f"Bearer {SECRET}"}


class Pool:
    def __init__(self, run_job, tmp_path: pathlib.Path, *flags: str, leads: bool = True, **how: Any) -> None:
        """`leads=False`: a standby, whose URL comes once it leads (`listening`); `how`: run_job's
        own keywords (`program`, `cwd`, `env`: an installed `ringmaster`)."""
        self.proc: Job = run_job("serve", "--api-port", "0", "--warmup-grace", "10", "--start-timeout", "30",
                                 "--checkpoint-root", str(tmp_path / "ckpt"), *flags, verb="pool", **how)
        self.url = ""
        if leads:
            self.listening(60)

    def listening(self, timeout_s: float) -> None:
        self.url = str(self.proc.wait_event("pool.listening", timeout_s)["url"])

    def call(self, path: str, body: dict | None = None) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", headers={**AUTH, "Content-Type": "application/json"},
                                         data=json.dumps(body).encode() if body is not None else None,
                                         method="POST" if body is not None else "GET")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)

    def submit(self, log_dir: pathlib.Path, min_np: int, max_np: int, epochs: int, samples: int,
               stop: pathlib.Path | None = None, **kw) -> str:
        """Submit `workloads/elastic_job.py`; with `stop`, it trains until that file appears (at
        the end of that epoch), so that the job lasts as long as the test needs it, no longer."""
        log_dir.mkdir(exist_ok=True)
        command = ["python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(log_dir), "--epochs", str(epochs),
                   "--samples", str(samples), "--step-time", "0.05", "--timestamps"]
        if stop is not None:
            command += ["--stop-file", str(stop)]
        return str(self.call("/jobs", {"command": command, "min_np": min_np, "max_np": max_np, **kw})["id"])

    def job(self, job_id: str) -> dict:
        return self.call(f"/jobs/{job_id}")

    def wait_job(self, job_id: str, predicate, timeout_s: float, what: str) -> dict:
        def check() -> dict | None:
            if self.proc.proc.poll() is not None:
                raise AssertionError(f"the pool exited ({self.proc.proc.returncode}):\n{self.proc.output[-5000:]}")
            try:
                job = self.job(job_id)
            except OSError:  # a reply slower than the call's 10 s on a loaded machine: asked again,
                return None  # as `Job.wait_status` does (the deadline and the pool's exit still end the wait)
            if job["state"] in ("failed", "cancelled") and "fail" not in what and "cancel" not in what:
                raise AssertionError(f"job {job_id} {job['state']}: {job['message']}\n{self.proc.output[-5000:]}")
            return job if predicate(job) else None

        return wait_for(check, timeout_s, what, interval_s=0.1)


def sizes_logged(log_dir: pathlib.Path) -> list[int]:
    """The sizes the job's commits were made at, in time order, runs of one size folded."""
    commits = sorted((r["time"], r["size"]) for records in read_logs(log_dir).values() for r in records
                     if r["event"] == "commit")
    folded: list[int] = []
    for _, size in commits:
        if not folded or folded[-1] != size:
            folded.append(size)
    return folded
