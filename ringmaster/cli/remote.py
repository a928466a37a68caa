"""The commands that talk to a running job through its control API: `ringmaster scale`,
`ringmaster drain` / `undrain`, `ringmaster status` (the job as a table) and `ringmaster events`
(its events, `--follow`ed)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from typing import Any, Callable, Sequence, TextIO

from ringmaster.common.api_client import ApiClient, ApiError
from ringmaster.common.secret import SECRET_ENV

#: Seconds between two polls of `ringmaster events --follow`.
FOLLOW_POLL_S = 0.5


def add_api_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api", required=True, help="the job's control API, e.g. http://127.0.0.1:8080 (printed at "
                                                     "start)")
    parser.add_argument("--secret-file", default=None, metavar="FILE", help=f"the job secret (default: ${SECRET_ENV})")
    parser.add_argument("--tls-ca", default=None, metavar="FILE",
                        help="the CA of an https:// control API's certificate (default: the system's)")
    parser.add_argument("--job", default=None, metavar="ID",
                        help="with --api a pool's control API (`ringmaster pool serve`): that job of the pool")


def job_path(job: str | None) -> str:
    """Where a job's calls go: the API's root for a job's own API, `/jobs/ID` for a pool's job."""
    return "" if job is None else f"/jobs/{urllib.parse.quote(job, safe='')}"


def scale(client: ApiClient, np: int, out: TextIO | None = None, job: str | None = None) -> int:
    """POST /scale and print the answer."""
    out = out or sys.stdout
    answer = client.post(f"{job_path(job)}/scale", {"np": np})
    if job is not None:
        print(f"ringmaster: job {answer.get('id')} may have up to {answer.get('max_np')} workers; the pool resizes it "
              f"at its next commit ({answer.get('reason')})", file=out)
        return 0
    print(f"ringmaster: {_text(answer, 'message')}", file=out)
    return 0


def drain(client: ApiClient, host: str, deadline_s: float | None, out: TextIO | None = None) -> int:
    """POST /hosts/HOST/drain (with the deadline, else the job's default) and print the answer."""
    out = out or sys.stdout
    body = {} if deadline_s is None else {"deadline_s": deadline_s}
    answer = client.post(f"/hosts/{urllib.parse.quote(host, safe='')}/drain", body)
    print(f"ringmaster: {_text(answer, 'message')}", file=out)
    return 0


def undrain(client: ApiClient, host: str, out: TextIO | None = None) -> int:
    """POST /hosts/HOST/undrain and print the answer."""
    out = out or sys.stdout
    answer = client.post(f"/hosts/{urllib.parse.quote(host, safe='')}/undrain", {})
    print(f"ringmaster: {_text(answer, 'message')}", file=out)
    return 0


def status(client: ApiClient, out: TextIO | None = None, job: str | None = None) -> int:
    """GET /status, printed as `ringmaster run`'s status line and tables of hosts and workers."""
    out = out or sys.stdout
    print(render_status(client.get(f"{job_path(job)}/status")), file=out)
    return 0


#: The kinds that end a job: `events --follow` stops after printing one.
_ENDS = ("job.succeeded", "job.failed", "job.stopped")


def events(client: ApiClient, since: int, follow: bool, as_json: bool, out: TextIO | None = None,
           sleep: Callable[[float], None] = time.sleep, job: str | None = None,
           ended: Callable[[], int | None] | None = None) -> int:
    """Print the job's events from number `since` on. With `follow`, keep printing new ones
    until the job's end is printed (exit 0 if it succeeded, 1 if it failed; Ctrl-C stops earlier).
    The job's end is known by its last event, not by asking afterwards: `ringmaster run` and its
    API are gone moments after it. A pool's job outlives its rendezvous: `ended()` (its exit
    status once it has ended, else None) is asked when no new event came; followed while it is
    still queued (it has no events before it runs), it is waited for."""
    out = out or sys.stdout
    said_waiting = False
    while True:
        try:
            page = client.get(f"{job_path(job)}/events", since=since)
        except ApiError as exc:
            if not (follow and ended is not None and exc.status == 409):
                raise
            if (code := ended()) is not None:  # (cancelled before it ever ran)
                return code
            if not said_waiting:
                print(f"({exc}; waiting for it to start, Ctrl-C to stop)", file=out, flush=True)
                said_waiting = True
            sleep(FOLLOW_POLL_S)
            continue
        if not isinstance(page, dict) or not isinstance(page.get("events"), list):
            raise ApiError(f"{client.api}/events answered something else than a page of events")
        if page.get("dropped", 0) > since:
            print(f"({page['dropped'] - since} older event(s) are no longer kept by the job)", file=out)
        for record in page["events"]:
            print(json.dumps(record) if as_json else render_event(record), file=out, flush=True)
            if follow and record.get("kind") in _ENDS:
                return 0 if record["kind"] == "job.succeeded" else 1
        since = int(page.get("next", since))
        if page["events"]:
            continue  # more may be waiting
        if not follow:
            return 0
        if ended is not None and (code := ended()) is not None:
            return code
        sleep(FOLLOW_POLL_S)


def render_event(record: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(float(record.get("time", 0))))
    generation = record.get("generation")
    where = f"[gen {generation}] " if generation is not None else ""
    return f"{stamp} #{record.get('seq')} {record.get('level', '')[:1]} {where}{record.get('message', '')}"


def render_status(job: dict[str, Any]) -> str:
    """The status as text: one line, then hosts and workers as aligned tables."""
    target = "" if job.get("target_np") is None else f" (target {job['target_np']})"
    rate = "" if job.get("steps_per_second") is None else f", {job['steps_per_second']:.2f} steps/s"
    loss = "" if job.get("loss") is None else f", loss {job['loss']:.4g}"
    lines = [
        f"{job.get('state')}: generation {job.get('generation')}, world size {job.get('world_size')}{target}, "
        f"{job.get('steps')} steps committed{rate}{loss}, {job.get('resets')} reset(s); {job.get('message')}",
    ]
    hosts = [(h["name"], str(h["slots"]), h.get("state") or ("blacklisted" if h["blacklisted"] else
              ("connected" if h["agent_connected"] else ("discovered" if h["discovered"] else "gone"))),
              str(h.get("agent_pid") or "-")) for h in job.get("hosts", [])]
    lines += ["", *table(("host", "slots", "state", "agent pid"), hosts)]
    workers = [(w["worker_id"], w["host"], "-" if w.get("rank") is None else str(w["rank"]), w["phase"],
                str(w.get("commits", 0)), str(w.get("pid") or "-"),
                w.get("failed") or ("done" if w.get("done") else ""))
               for w in job.get("workers", [])]
    lines += ["", *table(("worker", "host", "rank", "phase", "commits", "pid", "note"), workers)]
    return "\n".join(lines)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in (header, *rows)]


def _text(answer: Any, field: str) -> str:
    value = answer.get(field) if isinstance(answer, dict) else None
    return value if isinstance(value, str) else json.dumps(answer)[:300]
