"""The HTTP control API (FastAPI): what the job is doing, and scaling it.

`GET /status` returns a `JobStatus`; `GET /events?since=N&limit=M` the job's events from
number N on (an `EventPage`); `POST /scale` with `{"np": N}` asks for N workers;
`GET /healthz` answers while the rendezvous lives; `GET /` is the dashboard page. Handlers are
`async`, so they run on the rendezvous' event loop, the only thread that touches the job; they
read it as one immutable value (`control/view.JobView`) and change it only through its inputs.
"""

from __future__ import annotations

import functools
import hmac
import importlib.resources
import ipaddress
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from ringmaster import __version__
from ringmaster.common.errors import Refused
from ringmaster.rendezvous.control.drains import MAX_DRAIN_DEADLINE_S
from ringmaster.rendezvous.control.view import ALL_ROWS, NO_ROWS, HostView, JobView, ViewOf, WorkerView
from ringmaster.rendezvous.server.body_after_auth import documented, json_body
from ringmaster.rendezvous.server.body_limit import BodyLimit
from ringmaster.rendezvous.server.host_check import HostCheck
from ringmaster.rendezvous.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ringmaster.rendezvous.server.metrics import JobMetrics
from ringmaster.settings import DEFAULT_DRAIN_DEADLINE_S

#: The largest world size `POST /scale` takes (a bound, so no absurd number reaches the job).
MAX_SCALE_NP = 1_000_000
#: Most events one `GET /events` answers with (ask again from `next` for more).
MAX_EVENTS_PAGE = 1000


class GenerationStatus(BaseModel):
    number: int
    size: int
    cause: str
    causes: list[str] = Field(description="why it replaced the one before: failure, host_added, host_lost, ...")
    started: float = Field(description="when it formed, seconds since the epoch")
    recovery_s: Optional[float] = Field(None, description="from the failure before it to rank 0's first commit")
    assigned_s: Optional[float] = Field(None, description="from the failure before it (or its forming) to the last "
                                        "of its assignments leaving the rendezvous")
    assigned_at: Optional[float] = Field(None, description="when that was, seconds since the epoch")


class GlobalBatchStatus(BaseModel):
    """A global batch the script declared (`ElasticSampler(global_batch_size=..., micro_batch_size=...)`)."""

    size: int = Field(description="samples per optimizer step, whatever the world size")
    micro_batch: int = Field(description="samples per micro-batch (one forward and backward pass)")
    micro_batches: int = Field(description="micro-batches per step, shared by the ring")
    most_workers: int = Field(description="the most workers with something to compute: the micro-batches, times a "
                                          "replica group's size where the script deals them to groups")
    accumulation: dict[str, int] = Field(description="each worker's micro-batches per step in its current generation")


class ScaleRequest(BaseModel):
    """Strict: `true`, `2.0`, `"2"` or `1e400` are refused (422), not coerced."""

    model_config = ConfigDict(extra="forbid")
    np: StrictInt = Field(ge=1, le=MAX_SCALE_NP, description="the number of workers wanted (within --min-np and "
                                                             "--max-np)")


class ScaleReply(BaseModel):
    np: int
    message: str


class DrainBody(BaseModel):
    """Strict as `ScaleRequest`: a deadline is a number of seconds, up to a day."""

    model_config = ConfigDict(extra="forbid")
    deadline_s: Union[StrictInt, StrictFloat] = Field(
        DEFAULT_DRAIN_DEADLINE_S, gt=0, le=MAX_DRAIN_DEADLINE_S, allow_inf_nan=False,
        description="seconds for the host's workers to reach a commit and leave; after it they are stopped")


class DrainReply(BaseModel):
    host: str
    message: str


class JobStatus(BaseModel):
    state: str  # "starting", "running", "succeeded", "failed"
    message: str
    generation: int
    world_size: int
    target_np: Optional[int]
    resets: int
    steps: int
    hosts: list[HostView]  # the job's own shapes, as the control layer gives them (a page of them)
    workers: list[WorkerView]
    events: list[str]
    events_dropped: int  # older events no longer kept (the job keeps its newest 1000)
    refused_calls: int = 0  # gRPC calls refused for want of the job secret
    min_np: int = 1
    max_np: Optional[int] = None
    steps_per_second: Optional[float] = None  # committed steps per second lately (with metrics)
    loss: Optional[float] = None  # the loss last reported by the script (hvd.report), rank 0's
    generations: list[GenerationStatus] = Field(default_factory=list,
                                                description="the newest generations, oldest first")
    global_batch: Optional[GlobalBatchStatus] = Field(None, description="the global batch the script declared, if any")
    hosts_total: int = Field(0, description="the job's hosts in all; `hosts` holds those from ?offset=, at most "
                                            "?limit=")
    workers_total: int = Field(0, description="the job's workers in all; `workers` holds those from ?offset=, at most "
                                              "?limit=")
    version: str = Field(__version__, description="the rendezvous's Ringmaster version (`ringmaster --version`); an "
                                                  "agent of another version is warned of by the event "
                                                  "agent.version_differs")


#: Hosts and workers one GET /status lists at most (?limit=; a job of thousands is read in pages).
STATUS_PAGE = 1000
#: The largest ?limit= of GET /status.
MAX_STATUS_PAGE = 10_000


class EventRecord(BaseModel):
    seq: int = Field(description="the event's number in the job, from 0")
    kind: str
    level: str
    generation: Optional[int]
    time: float = Field(description="seconds since the epoch")
    message: str
    fields: dict[str, Any]


class EventPage(BaseModel):
    events: list[EventRecord]
    next: int = Field(description="ask for `since=next` to get what comes after these")
    dropped: int = Field(description="events older than the oldest still kept (the job keeps its newest 1000)")


def event_page(view: JobView, since: int, limit: int, wall_offset: float) -> EventPage:
    """Events numbered `since` on (at most `limit`); `wall_offset` turns the control layer's
    clock into seconds since the epoch."""
    kept = view.events
    first = view.events_dropped  # the number of the oldest kept event
    start = max(since, first) - first
    chosen = kept[start:start + limit]
    records = [
        EventRecord(seq=first + start + i, kind=e.kind.value, level=logging.getLevelName(e.level),
                    generation=e.generation,
                    time=e.time + wall_offset, message=e.message,
                    fields={k: v for k, v in e.as_dict().items() if k not in ("kind", "generation")})
        for i, e in enumerate(chosen)
    ]
    return EventPage(events=records, next=first + start + len(chosen), dropped=first)


@dataclass
class EventFollowers:
    """Who reads the events: when /events was last asked, and how far its answer went. A job
    that ends waits (a little) for a follower to fetch its last events before the API goes."""

    last_poll: float | None = None
    served_upto: int = 0

    def caught_up(self, view: JobView, idle_s: float) -> bool:
        """True when nobody asked for events in the last `idle_s`, or the last answer held them all."""
        if self.last_poll is None or view.time - self.last_poll > idle_s:
            return True
        return self.served_upto >= view.events_dropped + len(view.events)


#: The types of a page's files, by suffix.
_PAGE_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8"}
#: A page runs only its own script and talks only to its API; no other site may frame it.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@functools.cache
def _page_file(package: str, name: str) -> bytes:
    return (importlib.resources.files(package) / "dashboard" / name).read_bytes()


def serve_pages(app: FastAPI, package: str, routes: dict[str, str]) -> None:
    """Serve the files of `package`'s `dashboard/` folder (they ship with Ringmaster, read once)
    at the given paths, with headers that let them run nothing else."""
    def route(name: str) -> Callable[[], Awaitable[Response]]:
        async def page() -> Response:  # (no parameters: nothing from the request picks the file)
            return Response(content=_page_file(package, name), media_type=_PAGE_TYPES[name[name.rindex("."):]],
                            headers=_PAGE_HEADERS)
        return page

    for path, name in routes.items():
        app.add_api_route(path, route(name), methods=["GET"], include_in_schema=False)


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8 and ::1: a caller on this machine."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def job_status(view: JobView, refused_calls: int = 0, metrics: JobMetrics | None = None) -> JobStatus:
    """The job's status, with the hosts and workers of the page `view` lists."""
    return JobStatus(
        state=view.state,
        message=view.message,
        generation=view.generation,
        world_size=view.world_size,
        target_np=view.limit,
        resets=view.resets,
        steps=view.steps,
        hosts=list(view.hosts),
        workers=list(view.workers),
        hosts_total=view.hosts_total,
        workers_total=view.workers_total,
        events=[f"[gen {e.generation}] {e.message}" for e in view.events[-200:]],
        events_dropped=view.events_dropped,
        refused_calls=refused_calls,
        min_np=view.min_np,
        max_np=view.max_np,
        steps_per_second=metrics.steps_per_second(view) if metrics is not None else None,
        loss=metrics.loss(view) if metrics is not None else None,
        generations=[GenerationStatus(**vars(entry)) for entry in metrics.generations] if metrics is not None else [],
        global_batch=_global_batch(view, metrics),
    )


def _global_batch(view: JobView, metrics: JobMetrics | None) -> GlobalBatchStatus | None:
    declared = metrics.global_batch(view) if metrics is not None else None
    if declared is None:
        return None
    size, micro, most, shares = declared
    return GlobalBatchStatus(size=size, micro_batch=micro, micro_batches=size // micro, most_workers=most,
                             accumulation=shares)


def create_app(
    view: ViewOf,
    scale_to: Callable[[int], object],
    secret: str | None = None,
    refused_calls: Callable[[], int] = lambda: 0,
    metrics: JobMetrics | None = None,
    followers: EventFollowers | None = None,
    host_names: set[str] | None = None,
    drain: Callable[[str, float], object] | None = None,
    undrain: Callable[[str], object] | None = None,
) -> FastAPI:
    """`view(page=...)` is the job as it is now, listing the hosts and workers of that page (read,
    never changed); `scale_to(np)` asks the job for `np` workers (through the rendezvous'
    inputs; `Refused` says why not). With the job
    `secret`, every change needs it as a bearer token, and so does reading the status from
    another machine. With `host_names`, only requests addressed to one of them (or to a loopback
    name) are answered."""
    app = FastAPI(title="Ringmaster control API")
    app.add_middleware(BodyLimit)
    if host_names is not None:
        app.add_middleware(HostCheck, names=host_names)

    def authorized(request: Request) -> None:
        if secret is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), secret.encode()):
            raise HTTPException(status_code=401, headers={"WWW-Authenticate": "Bearer"},
                                detail="this needs the job secret: send 'Authorization: Bearer <secret>' "
                                       "(ringmaster scale --secret-file FILE, or $RINGMASTER_SECRET)")

    def authorized_unless_local(request: Request) -> None:
        client = request.client.host if request.client else ""
        if not is_loopback(client):
            authorized(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # Where and why, without echoing the input back (it may not even be JSON-encodable: 1e400).
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.get("/status", response_model=JobStatus, dependencies=[Depends(authorized_unless_local)])
    async def status(offset: int = Query(0, ge=0, le=2**31),
                     limit: int = Query(STATUS_PAGE, ge=1, le=MAX_STATUS_PAGE)) -> JobStatus:
        return job_status(view(page=(offset, limit)), refused_calls(), metrics)

    @app.get("/metrics", dependencies=[Depends(authorized_unless_local)])
    async def prometheus() -> Response:
        """The job's metrics in Prometheus' text format (see rendezvous/server/metrics.py)."""
        if metrics is None:
            raise HTTPException(status_code=404, detail="this rendezvous keeps no metrics")
        return Response(content=metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/events", response_model=EventPage, dependencies=[Depends(authorized_unless_local)])
    async def events(since: int = Query(0, ge=0, le=2**62),
                     limit: int = Query(200, ge=1, le=MAX_EVENTS_PAGE)) -> EventPage:
        now = view(page=NO_ROWS)
        page = event_page(now, since, limit, time.time() - now.time)
        if followers is not None:
            followers.last_poll, followers.served_upto = now.time, page.next
        return page

    _add_scale_route(app, view, scale_to, metrics, authorized)
    _add_drain_routes(app, view, drain, undrain, authorized)

    # The dashboard page (it reads /status from the browser; see rendezvous/server/dashboard).
    serve_pages(app, "ringmaster.rendezvous.server", {"/": "index.html", "/dashboard.js": "dashboard.js",
                                                      "/dashboard.css": "dashboard.css"})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    return app


def _add_scale_route(app: FastAPI, view: ViewOf, scale_to: Callable[[int], object], metrics: JobMetrics | None,
                     authorized: Callable[[Request], None]) -> None:
    """POST /scale: the job asked for a number of workers, within what its global batch allows."""

    @app.post("/scale", response_model=ScaleReply, openapi_extra=documented(ScaleRequest))
    async def scale(request: ScaleRequest = Depends(json_body(ScaleRequest, authorized))) -> ScaleReply:
        declared = metrics.global_batch(view(page=NO_ROWS)) if metrics is not None else None
        if declared is not None and request.np > declared[2]:
            size, micro, most = declared[:3]
            raise HTTPException(status_code=409, detail=(
                f"cannot scale to {request.np} workers: the script's global batch of {size} samples is {size // micro} "
                f"micro-batches of {micro} per step, work for at most {most} workers; scale to at most {most}, "
                "or declare a smaller micro_batch_size"))
        try:
            scale_to(request.np)
        except Refused as refused:
            raise HTTPException(status_code=409, detail=str(refused)) from None
        capacity = view(page=NO_ROWS).capacity
        note = "" if capacity >= request.np else f"; only {capacity} slot(s) available now, more join as hosts appear"
        return ScaleReply(np=request.np, message=f"scaling to {request.np} workers at the next commit{note}")


def _add_drain_routes(app: FastAPI, view: ViewOf, drain: Callable[[str, float], object] | None,
                      undrain: Callable[[str], object] | None, authorized: Callable[[Request], None]) -> None:
    """POST /hosts/NAME/drain and /undrain: an operator takes a host out politely, and back
    (404 where this rendezvous takes no drains)."""

    def drained_host(name: str) -> str:
        """The path's host, if the job has it (404 otherwise, without echoing much of it)."""
        if drain is None or undrain is None:
            raise HTTPException(status_code=404, detail="this rendezvous takes no drains")
        if not any(h.name == name for h in view(page=ALL_ROWS).hosts):
            raise HTTPException(status_code=404, detail=f"no host {name[:100]!r} in this job (see GET /status)")
        return name

    @app.post("/hosts/{name}/drain", response_model=DrainReply, openapi_extra=documented(DrainBody, required=False))
    async def drain_host(name: str, body: Optional[DrainBody] = Depends(json_body(DrainBody, authorized, optional=True))
                         ) -> DrainReply:
        """Take the host out politely: its workers leave at their next commit, within the deadline."""
        host = drained_host(name)
        deadline = (body or DrainBody()).deadline_s
        try:
            drain(host, float(deadline))  # type: ignore[misc]
        except Refused as refused:
            raise HTTPException(status_code=409, detail=str(refused)) from None
        return DrainReply(host=host, message=f"draining {host}: its workers leave at their next commit, within "
                                             f"{deadline:g} s; `ringmaster undrain {host}` takes it back")

    @app.post("/hosts/{name}/undrain", response_model=DrainReply, dependencies=[Depends(authorized)])
    async def undrain_host(name: str) -> DrainReply:
        host = drained_host(name)
        try:
            undrain(host)  # type: ignore[misc]
        except Refused as refused:
            raise HTTPException(status_code=409, detail=str(refused)) from None
        return DrainReply(host=host, message=f"host {host} is back in the job: workers start there at the next commit")
