"""Shared fixtures: jobs that are always reaped."""

from __future__ import annotations

import pathlib
import sys

import pytest
from hypothesis import settings

# CI machines are small and busy: judge properties, not per-example speed.
settings.register_profile("ringmaster", deadline=None)
settings.load_profile("ringmaster")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import Job  # noqa: E402


@pytest.fixture
def run_job():
    """Start `ringmaster run` jobs; all are killed (with their hosts) at teardown."""
    jobs: list[Job] = []

    def start(*args: str, env: dict[str, str] | None = None, verb: str = "run") -> Job:
        job = Job([str(a) for a in args], env=env, verb=verb)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()
