"""A test's wait on a job fails at once, with the job's story, when the job has already failed:
not after the wait's whole deadline (a chaos run once waited 180 s on a job dead at 16 s)."""

from __future__ import annotations

import time

import pytest
from harness import wait_for

pytestmark = pytest.mark.slow


def test_a_wait_on_a_job_that_failed_fails_at_once_with_its_story(run_job) -> None:
    run_job("-np", "2", "python", "-c", "import sys; sys.exit(3)")
    started = time.monotonic()
    with pytest.raises(AssertionError, match="exited with code 1") as caught:
        wait_for(lambda: False, 120, "training that never comes")
    assert time.monotonic() - started < 60
    assert "job failed: worker localhost/" in str(caught.value) and "exited with code 3" in str(caught.value)
