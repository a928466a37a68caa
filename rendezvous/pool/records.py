"""The pool's jobs as store records (`pool serve --store etcd://...`): one JSON object per job
under `PREFIX/pool/jobs/ID`, so a restarted or standby pool takes every job up again.

A record read back is untrusted (another program may have written the key): it is parsed by a
strict pydantic model with bounded fields, and a record that does not parse is skipped and said,
never half-loaded. What lives only while a pool runs (the job's rendezvous, its last events, the
reason of the moment) is not kept.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from ringmaster.rendezvous.pool.table import ENDED, LIVE, MAX_COMMAND_ARGS, MAX_DEMAND, PoolJob
from ringmaster.rendezvous.scheduling.resources import RESOURCES
from ringmaster.settings import MAX_GROUP_SIZE

#: Sizes over time kept per job in its record.
SIZES_KEPT = 200


class JobRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: StrictStr = Field(max_length=100)
    name: StrictStr = Field(max_length=100)
    queue: StrictStr = Field(max_length=200)
    priority: StrictInt = Field(ge=-10**9, le=10**9)
    min_np: StrictInt = Field(ge=1, le=1_000_000)
    max_np: StrictInt = Field(ge=1, le=1_000_000)
    submitted_max_np: StrictInt = Field(ge=1, le=1_000_000)
    command: list[StrictStr] = Field(min_length=1, max_length=MAX_COMMAND_ARGS)
    submitted: StrictFloat
    state: StrictStr
    placement: dict[StrictStr, StrictInt] = Field(max_length=100_000)
    message: StrictStr = Field("", max_length=10_000)
    started_at: Optional[StrictFloat] = None
    ended_at: Optional[StrictFloat] = None
    resumes: StrictInt = Field(0, ge=0)
    sizes: list[tuple[StrictFloat, StrictInt]] = Field(default_factory=list, max_length=SIZES_KEPT)
    demand: dict[StrictStr, StrictFloat] = Field(default_factory=dict, max_length=len(RESOURCES))
    group_size: StrictInt = Field(1, ge=1, le=MAX_GROUP_SIZE)  # (records from before replica groups have none: 1)


def job_key(prefix: str, job_id: str) -> str:
    return f"{prefix}pool/jobs/{job_id}"


def to_record(job: PoolJob) -> dict[str, Any]:
    return JobRecord(id=job.id, name=job.name, queue=job.queue, priority=job.priority, min_np=job.min_np,
                     max_np=job.max_np, submitted_max_np=job.submitted_max_np or job.max_np, command=job.command,
                     submitted=float(job.submitted), state=job.state, placement=dict(job.placement),
                     message=job.message,
                     started_at=job.started_at, ended_at=job.ended_at, resumes=job.resumes,
                     sizes=[(float(t), int(n)) for t, n in job.sizes[-SIZES_KEPT:]], demand=dict(job.demand),
                     group_size=job.group_size).model_dump()


def from_record(value: Any) -> PoolJob:
    """The job a record holds, as a pool that starts again takes it up: one that was running (its
    agents died with the pool that led it) resumes from its last checkpoint, a cancel on its way
    is done. ValueError says what is wrong with a record."""
    try:
        record = JobRecord.model_validate(value)
    except ValidationError as exc:
        raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])) from None
    if record.state not in (*LIVE, *ENDED):
        raise ValueError(f"state {record.state[:40]!r} is not a job's state")
    if not record.min_np <= record.max_np <= record.submitted_max_np:
        raise ValueError(f"min_np {record.min_np}, max_np {record.max_np}, submitted_max_np {record.submitted_max_np}")
    if any(n % record.group_size for n in (record.min_np, record.max_np, record.submitted_max_np)):
        raise ValueError(f"min_np {record.min_np}, max_np {record.max_np}, submitted_max_np {record.submitted_max_np}: "
                         f"not whole groups of group_size {record.group_size}")
    if any(name not in RESOURCES or not 0 < amount <= MAX_DEMAND for name, amount in record.demand.items()):
        raise ValueError(f"demand {dict(list(record.demand.items())[:4])}: resources {', '.join(RESOURCES)}, each more "
                         f"than 0 and at most {MAX_DEMAND:g}")
    job = PoolJob(record.id, record.name, record.queue, record.priority, record.min_np, record.max_np,
                  list(record.command), record.submitted, message=record.message, started_at=record.started_at,
                  ended_at=record.ended_at, resumes=record.resumes, submitted_max_np=record.submitted_max_np,
                  sizes=[tuple(s) for s in record.sizes], demand=dict(record.demand),  # type: ignore[misc]
                  group_size=record.group_size)
    if record.state in ("running", "suspending", "suspended"):
        job.state, job.reason = "suspended", "the pool started again: it resumes from its last checkpoint"
    elif record.state == "cancelling":
        job.state = job.reason = "cancelled"
        job.message = "cancelled (the pool started again before its workers had stopped)"
    else:
        job.state = record.state
        job.reason = job.message if record.state in ENDED else "queued"
    return job
