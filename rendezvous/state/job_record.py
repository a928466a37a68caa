"""The job as keys and JSON values: what the rendezvous keeps in its store, and how a new
rendezvous process takes the job over from it.

Pure functions, no I/O. One key per host and per worker (a change to one member rewrites one
small value, never a global blob), one key for the current generation and one for the job's
counters, which also names the format and version. A record written by another format or
version is refused (`IncompatibleState`), never guessed at.

Only facts are kept, not timers: heartbeat times are the old process's clock and mean nothing
to the next one, which gives every host and worker a fresh heartbeat window instead.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ringmaster.common.errors import StateError
from ringmaster.discovery import MAX_SLOTS_PER_HOST, host_name_problem
from ringmaster.proto import environment as env_names
from ringmaster.rendezvous.control.assignment import RankAssignment
from ringmaster.rendezvous.control.drains import MAX_DRAIN_DEADLINE_S, MAX_DRAIN_REASON
from ringmaster.rendezvous.control.records import (
    Drain, DrainSource, Generation, Host, JobCounters, Phase, Revised, SavedJob, Worker,
)

R = TypeVar("R", bound=Revised)

#: Longest agent incarnation kept with a drain (the agent's own are 32 hex digits).
MAX_INCARNATION_CHARS = 64

FORMAT = "ringmaster-rendezvous"
VERSION = 1

#: The environment variables Ringmaster sets for workers: the only ones a worker record may hold.
ENV_NAMES = frozenset(value for name, value in vars(env_names).items() if name.isupper() and isinstance(value, str))
#: Longest value of one of them (a list of rendezvous addresses is the longest).
MAX_ENV_VALUE_CHARS = 8192

JOB_KEY = "job"
GENERATION_KEY = "generation"
HOSTS = "hosts/"
WORKERS = "workers/"


class IncompatibleState(StateError):
    """The store holds a job this version cannot read; the message says what to do."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobRecord(_Record):
    format: str
    version: int
    next_id: int
    hosts_sequence: int
    target_np: Optional[int]
    finishing: bool
    generations: int
    resets: int
    steps: int
    outcome: Optional[tuple[bool, str]]


class DrainRecord(_Record):
    """A host's drain. Its deadline is kept as the seconds it was given, not a time on the old
    process's clock: a rendezvous that takes the job over gives the drain that long again."""

    source: DrainSource
    reason: str = Field(max_length=MAX_DRAIN_REASON)
    deadline_s: float = Field(gt=0, le=MAX_DRAIN_DEADLINE_S)
    incarnation: str = Field(max_length=MAX_INCARNATION_CHARS)
    had_workers: bool
    done: bool


class HostRecord(_Record):
    slots: int = Field(ge=0, le=MAX_SLOTS_PER_HOST)
    discovered: bool
    agent_connected: bool
    agent_pid: Optional[int]
    drain: Optional[DrainRecord] = None  # (absent in records written before drains were kept)
    joined: bool = False  # its agent joined it by connecting (absent in older records)


class WorkerRecord(_Record):
    host: str
    slot: int
    env: dict[str, str]
    phase: str

    @field_validator("env")
    @classmethod
    def _only_ringmaster_names(cls, env: dict[str, str]) -> dict[str, str]:
        """The store is data: an environment variable Ringmaster never sets (LD_PRELOAD,
        PYTHONPATH, ...) in a worker's record means someone else wrote it."""
        foreign = sorted(name for name in env if name not in ENV_NAMES)
        if foreign:
            raise ValueError(f"a worker's environment holds {', '.join(n[:60] for n in foreign[:3])}, which Ringmaster "
                             "never sets (the record was written by something else)")
        if any(len(value) > MAX_ENV_VALUE_CHARS for value in env.values()):
            raise ValueError(f"a worker's environment holds a value of more than {MAX_ENV_VALUE_CHARS} characters")
        return env
    registered: bool
    elastic: bool
    stopping: bool
    failed: Optional[str]
    done: bool
    generation: int


class GenerationRecord(_Record):
    number: int
    members: list[dict[str, Any]]
    cause: str
    store_prefix: str
    over: Optional[str]
    update_sequence: int
    hosts_baseline: int


class Snapshots:
    """The value last built for each key, with the object and revision it came from, so that
    `job_values` rebuilds only the keys whose object changed since (see `records.Revised`)."""

    def __init__(self) -> None:
        self.built: dict[str, tuple[Revised, int, dict[str, Any]]] = {}

    def add(self, values: dict[str, dict[str, Any]], objects: Iterable[tuple[str, R]],
            build: Callable[[R], dict[str, Any]], fresh: dict[str, tuple[Revised, int, dict[str, Any]]]) -> None:
        """Put each (key, object)'s value in `values`, reusing the last one where it still holds."""
        built = self.built
        for key, obj in objects:
            entry = built.get(key)
            if entry is None or entry[0] is not obj or entry[1] != obj.revision:
                entry = (obj, obj.revision, build(obj))
            fresh[key] = entry
            values[key] = entry[2]


def _host_value(host: Host) -> dict[str, Any]:
    value: dict[str, Any] = {"slots": host.slots, "discovered": host.discovered,
                             "agent_connected": host.agent_connected, "agent_pid": host.agent_pid}
    if host.joined:
        value["joined"] = True
    drain = host.drain
    if drain is not None:
        value["drain"] = {"source": drain.source.value, "reason": drain.reason,
                          "deadline_s": max(1.0, drain.deadline_at - drain.requested_at),
                          "incarnation": drain.incarnation, "had_workers": drain.had_workers, "done": drain.done}
    return value


def _worker_value(w: Worker) -> dict[str, Any]:
    return {"host": w.host, "slot": w.slot, "env": w.env, "phase": w.phase.value, "registered": w.registered,
            "elastic": w.elastic, "stopping": w.stopping, "failed": w.failed, "done": w.done, "generation": w.generation}


def _generation_value(g: Generation) -> dict[str, Any]:
    return {"number": g.number, "members": [vars(a) for a in g.members], "cause": g.cause,
            "store_prefix": g.store_prefix, "over": g.over, "update_sequence": g.update_sequence,
            "hosts_baseline": g.hosts_baseline}


def job_values(saved: SavedJob, snapshots: Snapshots | None = None) -> dict[str, dict[str, Any]]:
    """The job's keys (relative to its prefix) and values. Workers that exited and are not
    members of the current generation are history: their keys go. With `snapshots`, values of
    unchanged objects are the very objects returned last time."""
    snap = snapshots or Snapshots()
    fresh: dict[str, tuple[Revised, int, dict[str, Any]]] = {}
    c = saved.counters
    job = JobRecord(format=FORMAT, version=VERSION, next_id=c.next_id, hosts_sequence=c.hosts_sequence,
                    target_np=c.target_np, finishing=c.finishing, generations=c.generations, resets=c.resets,
                    steps=c.steps, outcome=c.outcome)
    values: dict[str, dict[str, Any]] = {JOB_KEY: job.model_dump()}
    snap.add(values, ((HOSTS + name, host) for name, host in saved.hosts.items()), _host_value, fresh)
    generation = saved.generation
    members = generation.member_set if generation is not None else frozenset()
    kept = ((WORKERS + i, w) for i, w in saved.workers.items() if w.live or i in members)
    snap.add(values, kept, _worker_value, fresh)
    if generation is not None:
        snap.add(values, [(GENERATION_KEY, generation)], _generation_value, fresh)
    snap.built = fresh  # keys not asked for this time are forgotten
    return values


def read_job(values: dict[str, dict[str, Any]]) -> SavedJob | None:
    """The job kept in `values` (keys relative to the prefix); None if there is none."""
    if JOB_KEY not in values:
        if values:
            raise IncompatibleState(
                f"the store prefix holds keys ({', '.join(sorted(values)[:3])}, ...) but no '{JOB_KEY}' record: "
                "it was not written by ringmaster; choose another prefix in --store"
            )
        return None
    raw = values[JOB_KEY]
    if raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise IncompatibleState(
            f"the store holds a job in format {raw.get('format')!r} version {raw.get('version')!r}; this ringmaster "
            f"reads {FORMAT!r} version {VERSION}. Finish that job with the ringmaster that started it, or use "
            "another prefix in --store"
        )
    skipped: list[tuple[str, str]] = []
    try:
        job = JobRecord.model_validate(raw)
        hosts = {
            key.removeprefix(HOSTS): _host(key.removeprefix(HOSTS), HostRecord.model_validate(v))
            for key, v in values.items() if key.startswith(HOSTS) and _name_fits(key, skipped)
        }
        workers = {
            key.removeprefix(WORKERS): _worker(key.removeprefix(WORKERS), WorkerRecord.model_validate(v))
            for key, v in values.items() if key.startswith(WORKERS) and _name_fits(key, skipped, v.get("host"))
        }
        generation = _generation(GenerationRecord.model_validate(values[GENERATION_KEY])) if GENERATION_KEY in values else None
    except (ValidationError, ValueError, TypeError) as exc:
        raise IncompatibleState(f"the job in the store is damaged or from another version: {exc}") from None
    if generation is not None:
        missing = [i for i in generation.member_ids if i not in workers]
        if missing:
            raise IncompatibleState(f"the job in the store lacks the records of members {', '.join(missing)}")
    counters = JobCounters(next_id=job.next_id, hosts_sequence=job.hosts_sequence, target_np=job.target_np,
                           finishing=job.finishing, generations=job.generations, resets=job.resets, steps=job.steps,
                           outcome=job.outcome)
    return SavedJob(counters, hosts, workers, generation, skipped)


def _name_fits(key: str, skipped: list[tuple[str, str]], worker_host: object = None) -> bool:
    """Whether the host (`hosts/NAME`) or worker (`workers/HOST/N` of host `worker_host`) a key
    names could be one of ours: names read back from the store go on to ssh command lines and log
    lines, so they pass the rule names from discovery and the wire pass. Else the key is skipped."""
    name = key.split("/", 1)[1]
    if worker_host is None:
        problem = host_name_problem(name)
    else:
        host, _, number = name.rpartition("/")
        problem = (f"the worker's host is {str(worker_host)[:80]!r}" if host != worker_host else
                   host_name_problem(host) or (None if number.isascii() and number.isdigit() and len(number) < 12
                                               else f"{number[:20]!r} is not a worker number"))
    if problem is not None:
        skipped.append((key[:120], problem))
    return problem is None


def diff(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """What to write and what to delete to turn `old` into `new`."""
    puts = {key: value for key, value in new.items() if (was := old.get(key)) is not value and was != value}
    deletes = [key for key in old if key not in new]
    return puts, deletes


def _host(name: str, r: HostRecord) -> Host:
    d = r.drain
    # (on a clock that starts at 0: `HostPool.resumed` moves it onto the new process's clock)
    drain = None if d is None else Drain(d.source, d.reason, 0.0, d.deadline_s, d.incarnation,
                                         had_workers=d.had_workers, done=d.done)
    return Host(name, r.slots, discovered=r.discovered, agent_pid=r.agent_pid, agent_connected=r.agent_connected,
                drain=drain, joined=r.joined)


def _worker(worker_id: str, r: WorkerRecord) -> Worker:
    return Worker(
        worker_id, r.host, r.slot, dict(r.env), phase=Phase(r.phase), registered=r.registered, elastic=r.elastic,
        stopping=r.stopping, failed=r.failed, done=r.done, generation=r.generation,
    )


def _generation(r: GenerationRecord) -> Generation:
    members = [RankAssignment(**m) for m in r.members]
    return Generation(r.number, members, r.cause, r.store_prefix, over=r.over,
                      update_sequence=r.update_sequence, hosts_baseline=r.hosts_baseline)
