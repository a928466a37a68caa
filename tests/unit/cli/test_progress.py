"""`ringmaster run`'s progress: the status line on a terminal, job.progress events otherwise."""

from __future__ import annotations

import asyncio
import io
import logging
import types
from typing import Callable

from coordinator_rig import Rig

from ringmaster.cli.progress import ProgressLine, progress_fields, status_text
from ringmaster.common import logs
from ringmaster.common.events import Event, Kind, log_event
from ringmaster.rendezvous.server.metrics import JobMetrics


def job() -> tuple[Rig, types.SimpleNamespace]:
    rig = Rig(min_np=1)
    ids = rig.start_elastic({"a": 2})
    rig.now = 5.0
    rig.worker_heartbeat(ids[0], 40, True)
    server = types.SimpleNamespace(view=lambda page: rig.coordinator.view(rig.now, page),
                                   metrics=JobMetrics(lambda: rig.coordinator.view(rig.now)))
    return rig, server


def show_until(line: ProgressLine, server: types.SimpleNamespace, out: io.StringIO, text: str,
               then: Callable[[], None] = lambda: None) -> None:
    """Run `line` until `text` is in `out` (30 s at most), call `then`, stop it; logging goes back to stderr."""
    async def show() -> None:
        task = asyncio.create_task(line.run(server))  # type: ignore[arg-type]
        while text not in out.getvalue():
            await asyncio.sleep(0.01)
        then()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    try:
        asyncio.run(asyncio.wait_for(show(), 30))
    finally:
        logs.configure("text", "INFO")


def test_the_status_line_says_generation_size_steps_rate_and_time_since_the_reset() -> None:
    rig, server = job()
    rig.now = 12.5
    fields = progress_fields(server)  # type: ignore[arg-type]
    assert fields == {"number": 1, "size": 2, "steps": 40, "rate": 0.0, "since_reset_s": 12.5}
    assert (
        status_text(fields) == "generation 1, world size 2, 40 steps committed, 0 steps/s, 12.5 s since the last reset"
    )
    assert progress_fields(types.SimpleNamespace(view=lambda page: None,
                                                 metrics=None)) is None  # type: ignore[arg-type]


def test_on_a_terminal_the_line_is_redrawn_and_cleared_before_each_log_line() -> None:
    _, server = job()
    out = io.StringIO()
    logs.configure("text", "INFO", stream=out)

    def log_one() -> None:
        log_event(logging.getLogger(logs.RENDEZVOUS), Event(Kind.HOSTS_CHANGED, {"description": "added b:1"}))

    show_until(ProgressLine(out, True, lambda: 8.0, every_s=0.01), server, out, "steps committed", log_one)
    text = out.getvalue()
    assert "\r\x1b[Kgeneration 1, world size 2, 40 steps committed" in text
    assert "since the last reset\r\x1b[Kringmaster: discovery: added b:1\n" in text  # cleared, then the log line
    assert text.endswith("\n")  # the line was not drawn again after the log line: nothing left over


def test_elsewhere_progress_is_a_plain_event_now_and_then() -> None:
    rig, server = job()
    rig.now = 8.0  # the job's clock (the rendezvous' and the line's, as in `run`)
    out = io.StringIO()
    logs.configure("json", "INFO", stream=out)

    show_until(ProgressLine(io.StringIO(), False, lambda: 8.0, every_s=0.01), server, out, "job.progress")
    import json

    record = json.loads(next(line for line in out.getvalue().splitlines() if "job.progress" in line))
    assert record["kind"] == "job.progress" and record["steps"] == 40 and record["since_reset_s"] == 8.0


def test_events_follow_prints_until_the_jobs_end_and_exits_with_its_outcome() -> None:
    """A stand-in for the API (its pages), so the end can come at a chosen poll."""
    from ringmaster.cli.remote import events

    def record(seq: int, kind: str, message: str) -> dict:
        return {"seq": seq, "kind": kind, "level": "INFO", "generation": 1,
                "time": 0.0, "message": message, "fields": {}}

    for end, code in (("job.succeeded", 0), ("job.failed", 1)):
        pages = [
            {"events": [record(0, "generation.formed", "generation 1 formed")], "next": 1, "dropped": 0},
            {"events": [], "next": 1, "dropped": 0},
            {"events": [record(1, end, "the end")], "next": 2, "dropped": 0},
        ]
        asked: list[int] = []

        class Client:
            api = "http://test"

            def get(self, path: str, since: int = 0) -> dict:
                asked.append(since)
                return pages.pop(0)  # (an IndexError if it asked once more after the end)

        out, slept = io.StringIO(), list[float]()
        assert events(Client(),  # type: ignore[arg-type]
                      0, follow=True, as_json=False, out=out, sleep=slept.append) == code
        lines = out.getvalue().splitlines()
        assert len(lines) == 2 and lines[0].endswith("[gen 1] generation 1 formed") and lines[1].endswith("the end")
        assert asked == [0, 1, 1] and slept == [0.5]


def test_logs_follow_waits_for_a_queued_pool_job_to_start_and_then_follows_it() -> None:
    """A pool's job has no events while it is queued (409): `logs --follow` waits for it, saying
    so once, instead of failing; one cancelled before it ran ends with its status."""
    from ringmaster.cli.remote import events
    from ringmaster.common.api_client import ApiError

    queued = ApiError("http://test answered HTTP 409: job j-1 is queued and has not run yet: no events", 409)
    record = {"seq": 0, "kind": "job.succeeded", "level": "INFO", "time": 0.0, "message": "done", "fields": {}}
    answers: list = [queued, queued, {"events": [record], "next": 1, "dropped": 0}]

    class Client:
        api = "http://test"

        def get(self, path: str, since: int = 0) -> dict:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    out, slept = io.StringIO(), list[float]()
    assert events(Client(),  # type: ignore[arg-type]
                  0, follow=True, as_json=False, out=out, sleep=slept.append,
                  job="j-1",
                  ended=lambda: None) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "waiting for it to start" in lines[0] and lines[1].endswith("done")
    assert len(slept) == 2
    answers[:] = [queued]
    assert events(Client(),  # type: ignore[arg-type]
                  0, follow=True, as_json=False, out=io.StringIO(), sleep=slept.append,
                  job="j-1",
                  ended=lambda: 1) == 1  # cancelled before it ran
    answers[:] = [queued]
    try:
        events(Client(),  # type: ignore[arg-type]
               0, follow=False, as_json=False, out=io.StringIO(), sleep=slept.append,
               job="j-1",
               ended=lambda: None)
    except ApiError as exc:
        assert exc.status == 409  # without --follow it says so at once
    else:
        raise AssertionError("logs without --follow waited for a queued job")
