"""The pool's job table: what a submission must pass, and the life of a job, as pure code."""

from __future__ import annotations

import pytest

from ringmaster.common.errors import Refused
from ringmaster.rendezvous.pool.table import MAX_LIVE_JOBS, MAX_SUBMITS_PER_MINUTE, JobTable, TooMany


def table() -> JobTable:
    return JobTable({"team-a", "team-b"})


@pytest.mark.parametrize("kwargs, says", [
    ({"command": []}, "no command"),
    ({"min_np": 3, "max_np": 2}, "need 1 <= min-np <= max-np"),
    ({"min_np": 0}, "need 1 <= min-np"),
    ({"min_np": 9, "max_np": 9}, "more than the pool's 8 slots"),
    ({"queue": "team-c"}, "unknown queue 'team-c': this pool has default, team-a, team-b"),
    ({"priority": 10**6}, "--priority 1000000 is outside -1000..1000"),
    ({"priority": -1001}, "outside"),
    ({"name": "../etc"}, "--name '../etc'"),
    ({"name": "x" * 65}, "--name"),
    ({"command": ["python", "a\x00b"]}, "NUL"),
    ({"command": ["x"] * 2000}, "longer than"),
    ({"group_size": 2, "min_np": 3, "max_np": 4}, "--min-np 3 is not a whole number of groups: the job trains in "
                                                  "groups of 2 (--group-size); give 2 or 4"),
    ({"group_size": 2, "max_np": 5}, "--max-np 5 is not a whole number of groups"),
    ({"group_size": 0}, "--group-size 0: give 1 (no groups) to 4096"),
    ({"group_size": 5000}, "--group-size 5000"),
])
def test_a_bad_submission_is_refused_naming_what_was_wrong(kwargs, says) -> None:
    args = {"command": ["python", "train.py"], "min_np": 2, "max_np": 4, "now": 0.0, "capacity": 8, **kwargs}
    t = table()
    with pytest.raises(Refused, match=says.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        t.submit(**args)
    assert not t.jobs  # nothing half-made


def test_submissions_get_ids_and_are_queued_with_what_was_asked() -> None:
    t = table()
    job = t.submit(["python", "train.py"], 2, None, 5.0, 8, name="resnet", queue="team-a", priority=3)
    assert (job.id, job.state, job.min_np, job.max_np, job.queue, job.priority) == ("resnet-1",
                                                                                    "queued", 2, 2, "team-a", 3)
    assert t.submit(["python", "x.py"], 1, 4, 6.0, 8).id == "job-2"
    assert job.ask().placement == {} and job.ask().min_np == 2


def test_a_flood_of_submissions_is_refused_without_touching_the_jobs_there() -> None:
    t = table()
    for i in range(MAX_SUBMITS_PER_MINUTE):
        t.submit(["true"], 1, 1, 100.0 + i * 0.01, 8)
    with pytest.raises(TooMany, match="submissions in the last minute"):
        t.submit(["true"], 1, 1, 110.0, 8)
    assert len(t.jobs) == MAX_SUBMITS_PER_MINUTE
    t.submit(["true"], 1, 1, 161.0, 8)  # a minute later it takes more
    assert len(t.live()) == MAX_SUBMITS_PER_MINUTE + 1 <= MAX_LIVE_JOBS


def test_the_pool_holds_a_bounded_number_of_live_jobs() -> None:
    t = table()
    for i in range(MAX_LIVE_JOBS):
        t.submit(["true"], 1, 1, i * 0.2, 8)  # (under the rate: 300 a minute)
    with pytest.raises(TooMany, match=f"already holds {MAX_LIVE_JOBS} jobs"):
        t.submit(["true"], 1, 1, MAX_LIVE_JOBS * 0.2, 8)


def test_cancel_ends_a_queued_job_at_once_marks_a_running_one_and_refuses_an_ended_one() -> None:
    t = table()
    queued = t.submit(["true"], 1, 1, 0.0, 8)
    assert t.cancel(queued.id, 1.0).state == "cancelled"
    with pytest.raises(Refused, match="already ended \\(cancelled\\)"):
        t.cancel(queued.id, 2.0)
    running = t.submit(["true"], 1, 1, 0.0, 8)
    running.state, running.placement = "running", {"a": 1}
    assert t.cancel(running.id, 1.0).state == "cancelling"
    with pytest.raises(KeyError, match="no job 'nope'"):
        t.cancel("nope", 1.0)


def test_scale_stays_within_the_submitted_bounds() -> None:
    t = table()
    job = t.submit(["true"], 2, 6, 0.0, 8)
    assert t.scale(job.id, 3).max_np == 3
    assert t.scale(job.id, 6).max_np == 6
    for np in (1, 7):
        with pytest.raises(Refused, match="takes 2 to 6 workers"):
            t.scale(job.id, np)


def test_a_job_of_replica_groups_is_asked_for_and_scaled_in_whole_groups() -> None:
    t = table()
    job = t.submit(["true"], 2, 6, 0.0, 8, group_size=2)
    assert job.group_size == 2 and job.ask().group_size == 2  # what the policies see
    assert t.scale(job.id, 4).max_np == 4
    with pytest.raises(Refused, match="-np 3 is not a whole number of groups: job .* trains in groups of 2.*give 2 or "
                                      "4"):
        t.scale(job.id, 3)
    assert job.max_np == 4  # a refused scale changes nothing


def test_an_id_used_before_is_not_given_again() -> None:
    """A pool started again over the same checkpoint root must not hand a new job an old job's id
    (it would resume the old job's checkpoint)."""
    used = {"job-1", "job-2", "r-3"}
    t = table()
    assert t.submit(["true"], 1, 1, 0.0, 8, taken=used.__contains__).id == "job-3"
    assert t.submit(["true"], 1, 1, 0.0, 8, name="r", taken=used.__contains__).id == "r-4"


def test_a_jobs_sizes_over_time_are_bounded() -> None:
    from ringmaster.rendezvous.pool.table import SIZES_KEPT

    job = table().submit(["true"], 1, 1, 0.0, 8)
    for i in range(SIZES_KEPT + 50):
        job.placement = {"a": 1 + i % 2}
        job.sized(float(i))
    assert len(job.sizes) == SIZES_KEPT and job.sizes[-1] == (float(SIZES_KEPT + 49), 2)


def test_a_resize_settles_when_a_generation_forms_on_its_placement_and_the_interval_counts_from_then() -> None:
    t = table()
    job = t.submit(["python", "train.py"], 2, 4, 0.0, 8)
    job.state, job.placement, job.resized_at, job.settled = "running", {"a": 2, "b": 1}, 100.0, False  # as _resize
    assert job.ask(150.0, settle_within_s=300.0).settling
    assert not job.ask(401.0, settle_within_s=300.0).settling  # its newcomers given up on: no longer held
    job.formed({"a": 2}, 160.0)  # the old size again (a failure in between): not the resize
    assert not job.settled and job.resized_at == 100.0
    job.formed({"a": 2, "b": 1}, 170.0)
    assert job.settled and job.resized_at == 170.0 and not job.ask(171.0).settling
    job.formed({"a": 2, "b": 1}, 900.0)  # later generations at the same size do not restart the interval
    assert job.resized_at == 170.0
