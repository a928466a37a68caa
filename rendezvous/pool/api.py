"""The pool's control API (FastAPI, OpenAPI at /docs): submit, list, cancel and look into jobs,
and see the hosts. Every call but /healthz needs the pool's admin secret as a bearer token.

Models are strict pydantic: a priority of `"5"`, a min-np of `2.0` or an unknown field are
refused (422) rather than coerced; what the table refuses (an unknown queue, a gang larger
than the pool, a flood of submits) is answered 400 or 429 with the reason.
"""

from __future__ import annotations

import hmac
import time
from typing import Optional

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ringmaster.common.errors import Refused
from ringmaster.rendezvous.pool.metrics import PoolMetrics
from ringmaster.rendezvous.pool.service import PoolService
from ringmaster.rendezvous.pool.table import MAX_COMMAND_ARGS, TooMany
from ringmaster.rendezvous.pool.tokens import queue_of
from ringmaster.rendezvous.server.body_limit import BodyLimit
from ringmaster.rendezvous.server.http_api import (MAX_EVENTS_PAGE, EventPage, JobStatus, event_page, is_loopback,
                                                   job_status, serve_pages)
from ringmaster.rendezvous.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[StrictStr] = Field(min_length=1, max_length=MAX_COMMAND_ARGS,
                                     description="the training command each worker runs, e.g. [\"python\", \"train.py\"]")
    min_np: StrictInt = Field(ge=1, le=1_000_000, description="fewest workers: the job starts with this many together or not at all")
    max_np: Optional[StrictInt] = Field(None, ge=1, le=1_000_000, description="most workers (default: min_np)")
    name: Optional[StrictStr] = Field(None, max_length=200, description="a name, which the job's id starts with")
    queue: StrictStr = Field("default", max_length=200, description="the queue (a name --queue-weights gives)")
    priority: StrictInt = Field(0, ge=-10**9, le=10**9, description="higher runs first under --policy priority")


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


class HostRow(BaseModel):
    name: str
    slots: int
    used: int
    jobs: dict[str, int]
    blacklisted_for_s: float


class Caller(BaseModel):
    """Who called: the admin (`queue` None) or the holder of one queue's token."""

    queue: Optional[str] = None


def create_pool_app(pool: PoolService, secret: str, tokens: dict[str, str] | None = None) -> FastAPI:
    """`tokens`: token -> queue (`--queue-tokens`); their holders reach their queue's jobs only."""
    app = FastAPI(title="Ringmaster pool API")
    app.add_middleware(BodyLimit)
    tokens = tokens or {}

    def authorized(request: Request) -> Caller:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), secret.encode()):
            return Caller()
        queue = queue_of(token, tokens) if scheme.lower() == "bearer" else None
        if queue is None:
            raise HTTPException(status_code=401, headers={"WWW-Authenticate": "Bearer"},
                                detail="this needs the pool's secret or a queue's token: send 'Authorization: Bearer "
                                       "<secret or token>' (--secret-file FILE, or $RINGMASTER_SECRET)")
        return Caller(queue=queue)

    def reader(request: Request) -> Caller:
        """Reads (the jobs, the hosts, the metrics, the page's data) from this machine need no
        secret, as a job's own status does not; from elsewhere the secret or a token."""
        client = request.client.host if request.client else ""
        if is_loopback(client) and "authorization" not in request.headers:
            return Caller()
        return authorized(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": detail})

    def row(job_id: str) -> JobRow:
        job = pool.table.get(job_id)
        lease = pool.leases.get(job_id)
        metrics = lease.server.metrics if lease is not None else None
        return JobRow(id=job.id, name=job.name, queue=job.queue, priority=job.priority, state=job.state, size=job.size,
                      min_np=job.min_np, max_np=job.max_np, hosts=dict(job.placement), reason=job.reason,
                      message=job.message, submitted=job.submitted, started_at=job.started_at, ended_at=job.ended_at,
                      resumes=job.resumes, steps_per_second=metrics.steps_per_second() if metrics is not None else None,
                      api_url=lease.server.api_url if lease is not None else None, sizes=job.sizes[-200:])

    def known(job_id: str, caller: Caller) -> str:
        try:
            job = pool.table.get(job_id)
        except KeyError as exc:
            raise HTTPException(status_code=404, detail=exc.args[0]) from None
        if caller.queue is not None and job.queue != caller.queue:  # as if it were not there
            raise HTTPException(status_code=404, detail=f"no job {job_id[:80]!r} in queue {caller.queue}")
        return job_id

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/jobs", response_model=JobRow)
    async def submit(request: SubmitRequest, caller: Caller = Depends(authorized)) -> JobRow:
        if caller.queue is not None and request.queue != caller.queue:
            raise HTTPException(status_code=403, detail=f"this token submits to queue {caller.queue} only, not "
                                                        f"{request.queue[:80]!r}")
        try:
            job = pool.submit(list(request.command), request.min_np, request.max_np, request.name, request.queue,
                              request.priority)
        except TooMany as exc:
            raise HTTPException(status_code=429, detail=str(exc)) from None
        except Refused as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        return row(job.id)

    @app.get("/jobs", response_model=list[JobRow])
    async def jobs(caller: Caller = Depends(reader)) -> list[JobRow]:
        return [row(job.id) for job in list(pool.table.jobs.values()) if caller.queue in (None, job.queue)]

    @app.get("/jobs/{job_id}", response_model=JobRow)
    async def one(job_id: str, caller: Caller = Depends(reader)) -> JobRow:
        return row(known(job_id, caller))

    @app.post("/jobs/{job_id}/cancel", response_model=JobRow)
    async def cancel(job_id: str, caller: Caller = Depends(authorized)) -> JobRow:
        try:
            pool.cancel(known(job_id, caller))
        except Refused as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        return row(job_id)

    @app.post("/jobs/{job_id}/scale", response_model=JobRow)
    async def scale(job_id: str, request: ScaleRequest, caller: Caller = Depends(authorized)) -> JobRow:
        try:
            pool.scale(known(job_id, caller), request.np)
        except Refused as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        return row(job_id)

    def server(job_id: str, caller: Caller):
        try:
            return pool.server_of(known(job_id, caller))
        except KeyError as exc:
            raise HTTPException(status_code=409, detail=exc.args[0]) from None

    @app.get("/jobs/{job_id}/status", response_model=JobStatus)
    async def status(job_id: str, caller: Caller = Depends(authorized)) -> JobStatus:
        running = server(job_id, caller)
        view = running.view()
        assert view is not None
        return job_status(view, running.auth.refused if getattr(running, "auth", None) else 0, running.metrics)

    @app.get("/jobs/{job_id}/events", response_model=EventPage)
    async def events(job_id: str, since: int = Query(0, ge=0, le=2**62), limit: int = Query(200, ge=1, le=MAX_EVENTS_PAGE),
                     caller: Caller = Depends(authorized)) -> EventPage:
        try:
            view, wall = pool.view_of(known(job_id, caller))
        except KeyError as exc:
            raise HTTPException(status_code=409, detail=exc.args[0]) from None
        return event_page(view, since, limit, wall - view.time)

    metrics = PoolMetrics(pool)

    @app.get("/metrics")
    async def prometheus(caller: Caller = Depends(reader)) -> Response:
        """The pool's metrics in Prometheus' text format (rendezvous/pool/metrics.py)."""
        if caller.queue is not None:
            raise HTTPException(status_code=403, detail=f"a token of queue {caller.queue} cannot read the pool's metrics")
        return Response(content=metrics.render(), media_type=METRICS_CONTENT_TYPE)

    serve_pages(app, "ringmaster.rendezvous.pool", {"/": "pool.html", "/pool.js": "pool.js", "/pool.css": "pool.css"})

    @app.get("/hosts", response_model=list[HostRow])
    async def hosts(caller: Caller = Depends(reader)) -> list[HostRow]:
        if caller.queue is not None:
            raise HTTPException(status_code=403, detail=f"a token of queue {caller.queue} cannot do this; it needs the "
                                                        "pool's admin secret")
        now = time.time()
        rows = []
        for name, slots in pool.hosts.items():
            on = {j.id: j.placement[name] for j in pool.table.live() if name in j.placement}
            rows.append(HostRow(name=name, slots=slots, used=sum(on.values()), jobs=on,
                                blacklisted_for_s=max(0.0, pool.blacklisted.get(name, 0) - now)))
        return rows

    return app
