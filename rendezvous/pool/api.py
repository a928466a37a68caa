"""The pool's control API (FastAPI, OpenAPI at /docs): submit, list, cancel and look into jobs,
and see the hosts. Every call but /healthz needs the pool's admin secret as a bearer token.

Models are strict pydantic: a priority of `"5"`, a min-np of `2.0` or an unknown field are
refused (422) rather than coerced; what the table refuses (an unknown queue, a gang larger
than the pool, a flood of submits) is answered 400 or 429 with the reason.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from typing import Callable, Optional, Union

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, field_validator

from ringmaster import __version__
from ringmaster.common.errors import Refused
from ringmaster.common.keys import pool_host_key
from ringmaster.common.pool_host_wire import LeaveRequest, OrderRow, PollAnswer, PollRequest
from ringmaster.rendezvous.pool.host_board import BoardRefusal, HostBoard, Order
from ringmaster.rendezvous.pool.metrics import PoolMetrics
from ringmaster.rendezvous.pool.service import PoolService
from ringmaster.rendezvous.pool.table import MAX_COMMAND_ARGS, TooMany
from ringmaster.rendezvous.pool.tokens import queue_of
from ringmaster.rendezvous.server.body_after_auth import documented, json_body
from ringmaster.rendezvous.server.body_limit import BodyLimit
from ringmaster.rendezvous.server.http_api import (
    MAX_EVENTS_PAGE,
    MAX_STATUS_PAGE,
    STATUS_PAGE,
    EventPage,
    JobStatus,
    event_page,
    is_loopback,
    job_status,
    serve_pages,
)
from ringmaster.rendezvous.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ringmaster.settings import MAX_GROUP_SIZE

#: Seconds between two looks at a held poll's orders.
HOLD_STEP_S = 0.05


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[StrictStr] = Field(min_length=1, max_length=MAX_COMMAND_ARGS,
                                     description="the training command each worker runs, e.g. [\"python\", "
                                                 "\"train.py\"]")
    min_np: StrictInt = Field(ge=1, le=1_000_000, description="fewest workers: the job starts with this many together "
                                                              "or not at all")
    max_np: Optional[StrictInt] = Field(None, ge=1, le=1_000_000, description="most workers (default: min_np)")
    name: Optional[StrictStr] = Field(None, max_length=200, description="a name, which the job's id starts with")
    queue: StrictStr = Field("default", max_length=200, description="the queue (a name --queue-weights gives)")
    priority: StrictInt = Field(0, ge=-10**9, le=10**9, description="higher runs first under --policy priority")
    gpus_per_worker: Union[StrictInt, StrictFloat] = Field(0, ge=0, le=1e6, description="GPUs each worker takes")
    cpus_per_worker: Union[StrictInt, StrictFloat] = Field(0, ge=0, le=1e6, description="CPUs each worker takes")
    group_size: StrictInt = Field(1, ge=1, le=MAX_GROUP_SIZE,
                                  description="workers per replica group (FSDP2 inside a group): the job is sized in "
                                              "whole groups, min_np and max_np count them whole (default: 1, no "
                                              "groups)")

    @field_validator("command")
    @classmethod
    def _os_can_take(cls, command: list[str]) -> list[str]:
        """Each argument must be bytes the OS can pass: text, or the lone surrogates U+DC80..U+DCFF
        by which Python (and `ringmaster submit`) carries a byte that is not UTF-8."""
        for i, arg in enumerate(command):
            try:
                os.fsencode(arg)
            except UnicodeEncodeError as exc:
                raise ValueError(f"command[{i}] holds {arg[exc.start:exc.end]!r} at {exc.start}, which is no byte an "
                                 "OS argument can hold (a lone surrogate outside U+DC80..U+DCFF, which stand for the "
                                 "bytes that are not UTF-8): send the argument's bytes as UTF-8, or as those") from None
        return command


class ScaleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    np: StrictInt = Field(ge=1, le=1_000_000, description="the most workers the job may have from now on")


class JobRow(BaseModel):
    id: str
    name: str
    queue: str
    priority: int
    state: str = Field(description="queued, running, suspending, suspended, cancelling, succeeded, failed, cancelled")
    size: int
    min_np: int
    max_np: int
    hosts: dict[str, int]
    reason: str = Field(description="why it is where it is: why it waits, why it was resized")
    message: str
    submitted: float
    started_at: Optional[float]
    ended_at: Optional[float]
    resumes: int
    steps_per_second: Optional[float]
    api_url: Optional[str] = Field(description="the job's own control API and dashboard while it runs")
    sizes: list[tuple[float, int]] = Field(description="(time, size) at each change: its size over time")
    demand: dict[str, float] = Field(description="what each worker takes besides its slot (gpu, cpu)")
    group_size: int = Field(1, description="workers per replica group: its size changes by whole groups")
    measured: list[dict[str, float]] = Field(
        default_factory=list, description="its mean step at each (hosts, workers) it ran: step_s, and compute_s (the "
                                          "part not spent waiting for the ring); what --policy goodput fits")


class HostRow(BaseModel):
    name: str
    slots: int
    resources: dict[str, float] = Field(description="what its pool agent declares besides slots (GPUs, CPUs)")
    agent_pid: Optional[int] = Field(description="its pool agent's process id, as it says (none before it joined)")
    joined: bool = Field(description="whether its pool agent has joined (only then are its slots lent)")
    used: int
    jobs: dict[str, int]
    blacklisted_for_s: float


class Caller(BaseModel):
    """Who called: the admin (`queue` None) or the holder of one queue's token."""

    queue: Optional[str] = None


class PoolAccess:
    """Who may call: the pool's secret reaches everything; a queue's token (`--queue-tokens`)
    its queue's jobs only; reads from this machine need neither."""

    def __init__(self, secret: str, tokens: dict[str, str]) -> None:
        self.secret, self.tokens = secret, tokens

    def authorized(self, request: Request) -> Caller:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), self.secret.encode()):
            return Caller()
        queue = queue_of(token, self.tokens) if scheme.lower() == "bearer" else None
        if queue is None:
            raise HTTPException(status_code=401, headers={"WWW-Authenticate": "Bearer"},
                                detail="this needs the pool's secret or a queue's token: send 'Authorization: Bearer "
                                       "<secret or token>' (--secret-file FILE, or $RINGMASTER_SECRET)")
        return Caller(queue=queue)

    def reader(self, request: Request) -> Caller:
        """Reads (the jobs, the hosts, the metrics, the page's data) from this machine need no
        secret, as a job's own status does not; from elsewhere the secret or a token."""
        client = request.client.host if request.client else ""
        if is_loopback(client) and "authorization" not in request.headers:
            return Caller()
        return self.authorized(request)


def admin_only(caller: Caller, what: str) -> None:
    """A queue's token cannot read the pool as a whole."""
    if caller.queue is not None:
        raise HTTPException(status_code=403, detail=f"a token of queue {caller.queue} cannot {what}")


def job_row(pool: PoolService, job_id: str) -> JobRow:
    job = pool.table.get(job_id)
    lease = pool.leases.get(job_id)
    metrics = lease.server.metrics if lease is not None else None
    return JobRow(id=job.id, name=job.name, queue=job.queue, priority=job.priority, state=job.state, size=job.size,
                  min_np=job.min_np, max_np=job.max_np, hosts=dict(job.placement), reason=job.reason,
                  message=job.message, submitted=job.submitted, started_at=job.started_at, ended_at=job.ended_at,
                  resumes=job.resumes, steps_per_second=metrics.steps_per_second() if metrics is not None else None,
                  api_url=lease.server.api_url if lease is not None else None, sizes=job.sizes[-200:],
                  demand=dict(job.demand), measured=pool.measured(job.id), group_size=job.group_size)


def known_job(pool: PoolService, job_id: str, caller: Caller) -> str:
    """`job_id`, where the caller may see it (404 otherwise, as if it were not there)."""
    try:
        job = pool.table.get(job_id)
    except KeyError as exc:
        raise HTTPException(status_code=404, detail=exc.args[0]) from None
    if caller.queue is not None and job.queue != caller.queue:
        raise HTTPException(status_code=404, detail=f"no job {job_id[:80]!r} in queue {caller.queue}")
    return job_id


def host_rows(pool: PoolService) -> list[HostRow]:
    now = time.time()
    rows = []
    hosts = pool.pool_hosts
    declared, pids = hosts.board.find_resources(), hosts.board.pids()
    for name, slots in {**hosts.expected, **hosts.hosts}.items():
        on = {j.id: j.placement[name] for j in pool.table.live() if name in j.placement}
        rows.append(HostRow(name=name, slots=slots, joined=name in hosts.hosts, resources=declared.get(name, {}),
                            agent_pid=pids.get(name), used=sum(on.values()), jobs=on,
                            blacklisted_for_s=max(0.0, hosts.blacklisted.get(name, 0) - now)))
    return rows


def create_pool_app(pool: PoolService, secret: str, tokens: dict[str, str] | None = None) -> FastAPI:
    """`tokens`: token -> queue (`--queue-tokens`); their holders reach their queue's jobs only.
    Hosts' pool agents prove keys derived from the pool's join secret (`pool.pool_hosts.join_secret`)."""
    app = FastAPI(title="Ringmaster pool API")
    app.add_middleware(BodyLimit, hint='a job is {"command": [...], "min_np": N} and a few more fields (POST /jobs; '
                                      'GET /docs lists them): the command must fit, with its arguments')
    access = PoolAccess(secret, tokens or {})

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    _add_job_routes(app, pool, access)
    _add_running_job_routes(app, pool, access)
    metrics = PoolMetrics(pool)

    @app.get("/metrics")
    async def prometheus(caller: Caller = Depends(access.reader)) -> Response:
        """The pool's metrics in Prometheus' text format (rendezvous/pool/metrics.py)."""
        admin_only(caller, "read the pool's metrics")
        return Response(content=metrics.render(), media_type=METRICS_CONTENT_TYPE)

    serve_pages(app, "ringmaster.rendezvous.pool", {"/": "pool.html", "/pool.js": "pool.js", "/pool.css": "pool.css"})

    @app.get("/hosts", response_model=list[HostRow])
    async def hosts(caller: Caller = Depends(access.reader)) -> list[HostRow]:
        admin_only(caller, "do this; it needs the pool's admin secret")
        return host_rows(pool)

    add_host_routes(app, pool.pool_hosts.board, pool.pool_hosts.join_secret, lambda: pool.stopping)
    return app


def _add_job_routes(app: FastAPI, pool: PoolService, access: PoolAccess) -> None:
    """Submit, list, read, cancel and scale jobs."""

    @app.post("/jobs", response_model=JobRow, openapi_extra=documented(SubmitRequest))
    async def submit(request: SubmitRequest = Depends(json_body(SubmitRequest, access.authorized)),
                     caller: Caller = Depends(access.authorized)) -> JobRow:
        if caller.queue is not None and request.queue != caller.queue:
            raise HTTPException(status_code=403, detail=f"this token submits to queue {caller.queue} only, not "
                                                        f"{request.queue[:80]!r}")
        try:
            job = pool.submit(list(request.command), request.min_np, request.max_np, request.name, request.queue,
                              request.priority, {"gpu": float(request.gpus_per_worker),
                                                 "cpu": float(request.cpus_per_worker)}, request.group_size)
        except TooMany as exc:
            raise HTTPException(status_code=429, detail=str(exc)) from None
        except Refused as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        return job_row(pool, job.id)

    @app.get("/jobs", response_model=list[JobRow])
    async def jobs(caller: Caller = Depends(access.reader)) -> list[JobRow]:
        return [job_row(pool, job.id) for job in list(pool.table.jobs.values()) if caller.queue in (None, job.queue)]

    @app.get("/jobs/{job_id}", response_model=JobRow)
    async def one(job_id: str, caller: Caller = Depends(access.reader)) -> JobRow:
        return job_row(pool, known_job(pool, job_id, caller))

    @app.post("/jobs/{job_id}/cancel", response_model=JobRow)
    async def cancel(job_id: str, caller: Caller = Depends(access.authorized)) -> JobRow:
        try:
            pool.cancel(known_job(pool, job_id, caller))
        except Refused as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        return job_row(pool, job_id)

    @app.post("/jobs/{job_id}/scale", response_model=JobRow, openapi_extra=documented(ScaleRequest))
    async def scale(job_id: str, request: ScaleRequest = Depends(json_body(ScaleRequest, access.authorized)),
                    caller: Caller = Depends(access.authorized)) -> JobRow:
        try:
            pool.scale(known_job(pool, job_id, caller), request.np)
        except Refused as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        return job_row(pool, job_id)


def _add_running_job_routes(app: FastAPI, pool: PoolService, access: PoolAccess) -> None:
    """A job's status from its own rendezvous, and its events (which outlive it)."""

    @app.get("/jobs/{job_id}/status", response_model=JobStatus)
    async def status(job_id: str, offset: int = Query(0, ge=0, le=2**31),
                     limit: int = Query(STATUS_PAGE, ge=1, le=MAX_STATUS_PAGE),
                     caller: Caller = Depends(access.authorized)) -> JobStatus:
        try:
            running = pool.server_of(known_job(pool, job_id, caller))
        except KeyError as exc:
            raise HTTPException(status_code=409, detail=exc.args[0]) from None
        view = running.view((offset, limit))
        assert view is not None
        return job_status(view, running.auth.refused if running.auth is not None else 0, running.metrics)

    @app.get("/jobs/{job_id}/events", response_model=EventPage)
    async def events(job_id: str, since: int = Query(0, ge=0, le=2**62),
                     limit: int = Query(200, ge=1, le=MAX_EVENTS_PAGE),
                     caller: Caller = Depends(access.authorized)) -> EventPage:
        try:
            view, wall = pool.view_of(known_job(pool, job_id, caller))
        except KeyError as exc:
            raise HTTPException(status_code=409, detail=exc.args[0]) from None
        return event_page(view, since, limit, wall - view.time)


def add_host_routes(app: FastAPI, board: HostBoard, join_secret: str, stopping: Callable[[], bool]) -> None:
    """`POST /hosts/{name}/poll` and `/leave`, for hosts' pool agents, each proving its own host's
    key (`keys.pool_host_key`) and nothing else: a host's key opens no other call."""

    def host_of(name: str, request: Request) -> str:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        expected = pool_host_key(join_secret, name).hex() if len(name) <= 253 else ""
        if (scheme.lower() != "bearer" or not expected
                or not hmac.compare_digest(token.strip().encode(), expected.encode())):
            raise HTTPException(status_code=401, headers={"WWW-Authenticate": "Bearer"},
                                detail=f"host {name[:80]!r} must prove its key, derived from the pool's join secret "
                                       "(`ringmaster pool agent --secret-file FILE`, the file `pool serve "
                                       "--join-secret-file` names)")
        return name

    # (The key is checked before the body is read: a caller without it learns nothing of what the
    # body should hold.)
    @app.post("/hosts/{name}/poll", response_model=PollAnswer, openapi_extra=documented(PollRequest))
    async def poll(request: PollRequest = Depends(json_body(PollRequest, host_of)),
                   host: str = Depends(host_of)) -> PollAnswer:
        try:
            session, version = board.poll(host, request.session, request.slots, list(request.running),
                                          [(e.order, e.how) for e in request.ended], time.time(),
                                          {k: float(v) for k, v in request.resources.items()}, request.pid,
                                          request.applied)
        except BoardRefusal as exc:
            raise HTTPException(status_code=exc.status, detail=str(exc)) from None
        deadline = time.monotonic() + board.hold_s
        while version == request.version and request.session == session and time.monotonic() < deadline \
                and not stopping():
            await asyncio.sleep(HOLD_STEP_S)
            now_version = board.version(host)
            if now_version is None:
                break
            version = now_version
        held = board.orders(host, session, time.time())
        version, orders = held if held is not None else (version, [])
        return PollAnswer(session=session, version=version, hold_s=board.hold_s, timeout_s=board.timeout_s,
                          orders=[order_row(order) for order in orders])

    @app.post("/hosts/{name}/leave", openapi_extra=documented(LeaveRequest))
    async def leave(request: LeaveRequest = Depends(json_body(LeaveRequest, host_of)),
                    host: str = Depends(host_of)) -> dict[str, bool]:
        return {"left": board.leave(host, request.session)}


def order_row(order: Order) -> OrderRow:
    o = order.options
    return OrderRow(order=order.ident, job=order.job, rendezvous=o.rendezvous, key=order.key,
                    heartbeat_interval_s=float(o.heartbeat_interval_s), stop_grace_s=float(o.stop_grace_s),
                    reconnect_timeout_s=None if o.reconnect_timeout_s is None else float(o.reconnect_timeout_s),
                    spares=o.spares, drain_grace_s=None if o.drain_grace_s is None else float(o.drain_grace_s),
                    gpus_per_worker=float(order.gpus_per_worker))
