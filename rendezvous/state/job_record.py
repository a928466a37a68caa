"""The job as keys and JSON values: what the rendezvous keeps in its store, and how a new
rendezvous process takes the job over from it.

Pure functions, no I/O. One key per host and per worker (a change to one member rewrites one
small value, never a global blob), one per run of the generation's members, one for the current
generation and one for the job's counters, which also names the format and version. A record
written by another format or version is refused (`IncompatibleState`), never guessed at.

Nothing is kept that can be derived, so that a new generation rewrites only what changed: a
worker's record holds its place in the ring it was started into (the rest of its environment is
the resuming job's own), and leaves out its phase and generation while it is a member of the
current one (waiting for the next or not). The generation's members are kept as runs of one
host's workers under the order keys their members keep from one generation to the next
(`assignment.order_keys`): `members/K` lists the worker numbers whose keys are K, K+1, ... Their
ranks, local and cross ranks are computed again on reading (`assign_ranks`, as when it formed).
A host lost from 4,096 hosts x 8 workers rewrote the whole member list (235 KB); now it deletes
the lost host's run and keys and writes the generation and the job's counters (under 1 KB).
Members that leave at a generation's forming (retired: their host left the job, or it shrank)
keep the record they had as members; their host's key says which generation they were members
of (`left`), so a reader that finds one in no member run knows it is that generation's and
stopping. Half of a 4,096 x 8 job leaving rewrote 16,384 workers' keys (9.7 MB); now 2,048 hosts'.

Only facts are kept, not timers: heartbeat times are the old process's clock and mean nothing
to the next one, which gives every host and worker a fresh heartbeat window instead.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ringmaster.common.errors import StateError
from ringmaster.discovery import MAX_SLOTS_PER_HOST, host_name_problem
from ringmaster.rendezvous.control.assignment import RankAssignment, WorkerSlot, assign_ranks
from ringmaster.rendezvous.control.drains import MAX_DRAIN_DEADLINE_S, MAX_DRAIN_REASON
from ringmaster.rendezvous.control.records import (
    Drain,
    DrainSource,
    Generation,
    Host,
    JobCounters,
    JobWorkers,
    Phase,
    Revised,
    SavedJob,
    Worker,
)
from ringmaster.rendezvous.control.worker_env import RANK_ENV_NAMES

R = TypeVar("R", bound=Revised)

#: Longest agent incarnation kept with a drain (the agent's own are 32 hex digits).
MAX_INCARNATION_CHARS = 64

FORMAT = "ringmaster-rendezvous"
VERSION = 4
#: Versions read: 3 is 4 without hosts' `left` (its leavers' records say it all themselves).
READABLE = (3, 4)

#: The environment variables that say a worker's place in its ring: the only ones a worker record holds.
PLACE_NAMES = RANK_ENV_NAMES
#: Longest value of one of them.
MAX_ENV_VALUE_CHARS = 256

JOB_KEY = "job"
GENERATION_KEY = "generation"
HOSTS = "hosts/"
WORKERS = "workers/"
MEMBERS = "members/"
#: Order keys above this are refused on reading (JSON readers elsewhere hold integers as doubles).
MAX_ORDER_KEY = 2**53


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
    left: int = Field(0, ge=0, lt=MAX_ORDER_KEY)  # `Host.left` (absent: 0, none)


class WorkerRecord(_Record):
    host: str
    slot: int
    place: dict[str, str]
    phase: Optional[str] = None  # None: a member of the current generation
    registered: bool
    elastic: bool
    stopping: bool
    failed: Optional[str]
    done: bool
    generation: Optional[int] = None  # None: the current generation's number

    @field_validator("place")
    @classmethod
    def _only_place_names(cls, place: dict[str, str]) -> dict[str, str]:
        """The store is data: any other variable (LD_PRELOAD, PYTHONPATH, a checkpoint setting)
        in a worker's record means someone else wrote it."""
        foreign = sorted(name for name in place if name not in PLACE_NAMES)
        if foreign:
            raise ValueError(f"a worker's place holds {', '.join(n[:60] for n in foreign[:3])}, which is not a "
                             "variable of its place in the ring (the record was written by something else)")
        if any(len(value) > MAX_ENV_VALUE_CHARS for value in place.values()):
            raise ValueError(f"a worker's place holds a value of more than {MAX_ENV_VALUE_CHARS} characters")
        return place


class MemberRunRecord(_Record):
    """Members next to each other in rank order, on one host: worker `host/N` for each N."""

    host: str
    workers: list[int] = Field(min_length=1, max_length=MAX_SLOTS_PER_HOST)

    @field_validator("host")
    @classmethod
    def _a_host_name(cls, host: str) -> str:
        problem = host_name_problem(host)
        if problem is not None:
            raise ValueError(problem)
        return host

    @field_validator("workers")
    @classmethod
    def _worker_numbers(cls, workers: list[int]) -> list[int]:
        if any(n < 0 for n in workers):
            raise ValueError("a member run lists a negative worker number")
        return workers


class GenerationRecord(_Record):
    number: int
    size: int = Field(ge=0)  # its members, all in the `members/` runs (fewer: the runs were written in part)
    cause: str
    store_prefix: str
    over: Optional[str]
    update_sequence: int
    hosts_baseline: int
    announced_sequence: int = Field(0, ge=0)  # (0 in a record written before announcements)


class Snapshots:
    """The value last built for each key, with the object and revision it came from, so that
    `job_values` rebuilds only the keys whose object changed since (see `records.Revised`).

    While the generation stays the same, the workers' keys are brought up to date from the
    workers changed since the last build (`JobWorkers.take_changed`), not from a look at every
    worker: at 4,096 x 8 that look was 30-40 ms of every save, and a change makes ten. `changed`
    then names the keys the last build changed or removed (None: it looked at every key)."""

    def __init__(self) -> None:
        self.built: dict[str, tuple[Revised, int, dict[str, Any], int]] = {}
        self.runs: tuple[Generation | None, dict[str, dict[str, Any]]] = (None, {})
        self.places: dict[str, tuple[dict[str, str], dict[str, str]]] = {}  # worker id: its env, its place
        self.values: dict[str, dict[str, Any]] = {}  # the last build's (shared: `job_values` returns a copy)
        self.changed: set[str] | None = None
        self.host_keys: set[str] = set()  # the hosts' keys in `values`
        #: What the workers' keys were last built from: the workers, their takes, the generation.
        self._source: tuple[JobWorkers, int, Generation | None] | None = None

    def place(self, w: Worker) -> dict[str, str]:
        """The variables of `w`'s place in the ring, picked out of its environment once: every
        member's record is built again at a new generation (its number is the context), and
        picking them out of 32,768 environments was half of a host loss' save at 4,096 x 8."""
        kept = self.places.get(w.worker_id)
        if kept is None or kept[0] is not w.env:  # (an env is never changed in place once recorded)
            kept = self.places[w.worker_id] = (w.env, {name: v for name, v in w.env.items() if name in PLACE_NAMES})
        return kept[1]

    def add(self, values: dict[str, dict[str, Any]], objects: Iterable[tuple[str, R]],
            build: Callable[[R], dict[str, Any]], fresh: dict[str, tuple[Revised, int, dict[str, Any], int]],
            context: int = 0) -> None:
        """Put each (key, object)'s value in `values`, as `one` builds it, and its entry in `fresh`."""
        one = self.one
        for key, obj in objects:
            entry = fresh[key] = one(key, obj, build, context)
            values[key] = entry[2]

    def one(self, key: str, obj: R, build: Callable[[R], dict[str, Any]],
            context: int = 0) -> tuple[Revised, int, dict[str, Any], int]:
        """The entry of `key` for `obj`: the last one where it still holds (the object and its
        revision are the same, and so is the `context` it was built in), else built anew."""
        entry = self.built.get(key)
        if entry is None or entry[0] is not obj or entry[1] != obj.revision or entry[3] != context:
            entry = (obj, obj.revision, build(obj), context)
        return entry


def _host_value(host: Host) -> dict[str, Any]:
    value: dict[str, Any] = {"slots": host.slots, "discovered": host.discovered,
                             "agent_connected": host.agent_connected, "agent_pid": host.agent_pid}
    if host.joined:
        value["joined"] = True
    if host.left:
        value["left"] = host.left
    drain = host.drain
    if drain is not None:
        value["drain"] = {"source": drain.source.value, "reason": drain.reason,
                          "deadline_s": max(1.0, drain.deadline_at - drain.requested_at),
                          "incarnation": drain.incarnation, "had_workers": drain.had_workers, "done": drain.done}
    return value


def _worker_value(w: Worker, current: int, members: frozenset[str], place: dict[str, str],
                  left: int = 0) -> dict[str, Any]:
    """`current`: the current generation's number (0: none) and its `members`; what follows
    from them is left out. A member waiting for the next generation (a host update) is kept as a
    member: its hello to a rendezvous that takes the job over says it waits, and it is placed so.
    A member of generation `left` (its host's `Host.left`) that leaves is kept as it was while a
    member (not stopping: the host's key says it is), so that its key is not written again."""
    value: dict[str, Any] = {"host": w.host, "slot": w.slot, "place": place,
                             "registered": w.registered, "elastic": w.elastic, "stopping": w.stopping,
                             "failed": w.failed, "done": w.done}
    if left and w.stopping and w.generation == left and w.phase is Phase.MEMBER and w.worker_id not in members:
        value["stopping"] = False
        return value
    if not (w.phase is Phase.MEMBER or (w.phase is Phase.READY and w.worker_id in members)):
        value["phase"] = w.phase.value
    if w.generation != current:
        value["generation"] = w.generation
    return value


def _left(hosts: dict[str, Host], w: Worker) -> int:
    """The generation whose leavers `w`'s host speaks for (`Host.left`; 0: none, or no host). A
    mark moves on only at a new generation, which rebuilds every worker's record (its context)."""
    host = hosts.get(w.host)
    return host.left if host is not None else 0


def _member_runs(g: Generation) -> dict[str, dict[str, Any]]:
    """The generation's members as runs (`host/N` is worker N of `host`) under the order key of
    their first: a run goes on while the host and the next key (K+1, K+2, ...) do. A few bytes a
    worker, the host's name once a run, and a survivor's run unchanged from one generation to the next."""
    runs: dict[str, dict[str, Any]] = {}
    numbers: list[int] = []
    host, next_key = "", -1
    for a, key in zip(g.members, g.order):
        if a.host != host or key != next_key:
            numbers = []
            runs[f"{MEMBERS}{key}"] = {"host": a.host, "workers": numbers}
            host = a.host
        numbers.append(int(a.worker_id.rpartition("/")[2]))
        next_key = key + 1
    return runs


def _generation_value(g: Generation) -> dict[str, Any]:
    return {"number": g.number, "size": len(g.members), "cause": g.cause,
            "store_prefix": g.store_prefix, "over": g.over, "update_sequence": g.update_sequence,
            "hosts_baseline": g.hosts_baseline, "announced_sequence": g.announced_sequence}


def job_values(saved: SavedJob, snapshots: Snapshots | None = None) -> dict[str, dict[str, Any]]:
    """The job's keys (relative to its prefix) and values. Workers that exited and are not
    members of the current generation are history: their keys go. With `snapshots`, values of
    unchanged objects are the very objects returned last time."""
    return dict(build_values(saved, snapshots or Snapshots()))


def build_values(saved: SavedJob, snap: Snapshots) -> dict[str, dict[str, Any]]:
    """`job_values` into `snap.values` (shared, not a copy), saying in `snap.changed` which
    keys changed since the last build where it can tell."""
    workers = saved.workers
    generation = saved.generation
    source = snap._source
    if isinstance(workers, JobWorkers) and source is not None and source[0] is workers \
            and source[1] == workers.takes and source[2] is generation:  # (workers that tell what changed)
        _update_values(saved, snap, workers.take_changed())
    else:
        if isinstance(workers, JobWorkers):
            workers.take_changed()  # (every worker is looked at now: what changed before is in it)
        snap.values = _every_value(saved, snap)
        snap.host_keys = {key for key in snap.values if key.startswith(HOSTS)}
        snap.changed = None
    snap._source = (workers, workers.takes, generation) if isinstance(workers, JobWorkers) else None
    return snap.values


def _update_values(saved: SavedJob, snap: Snapshots, changed_workers: list[Worker]) -> None:
    """The keys of the job's counters, hosts and generation as `_every_value` builds them; the
    workers' only for those changed (the generation, so every worker's context, is the same)."""
    values, built = snap.values, snap.built
    changed: set[str] = set()
    counters = _job_value(saved)
    if values.get(JOB_KEY) != counters:
        values[JOB_KEY] = counters
        changed.add(JOB_KEY)
    hosts: dict[str, dict[str, Any]] = {}
    fresh: dict[str, tuple[Revised, int, dict[str, Any], int]] = {}
    snap.add(hosts, ((HOSTS + name, host) for name, host in saved.hosts.items()), _host_value, fresh)
    for key, value in hosts.items():
        if values.get(key) is not value:
            values[key] = value
            changed.add(key)
    for key in snap.host_keys - hosts.keys():
        del values[key]
        built.pop(key, None)
        changed.add(key)
    snap.host_keys = set(hosts)
    built.update(fresh)
    generation = saved.generation
    members = generation.member_set if generation is not None else frozenset()
    current = generation.number if generation is not None else 0
    workers = saved.workers
    for w in changed_workers:
        key = WORKERS + w.worker_id
        if workers.get(w.worker_id) is not w:
            if w.worker_id not in workers:  # deleted (a replaced worker's key is its successor's)
                values.pop(key, None)
                built.pop(key, None)
                changed.add(key)
            continue
        if w.live or w.worker_id in members:
            entry = built[key] = snap.one(key, w, lambda w: _worker_value(w, current, members, snap.place(w),
                                                                           _left(saved.hosts, w)), current)
            if values.get(key) is not entry[2]:
                values[key] = entry[2]
                changed.add(key)
        elif key in values:
            del values[key]
            built.pop(key, None)
            changed.add(key)
    if generation is not None:
        entry = built[GENERATION_KEY] = snap.one(GENERATION_KEY, generation, _generation_value)
        if values.get(GENERATION_KEY) is not entry[2]:
            values[GENERATION_KEY] = entry[2]
            changed.add(GENERATION_KEY)
    snap.changed = changed


def _job_value(saved: SavedJob) -> dict[str, Any]:
    c = saved.counters
    job = JobRecord(format=FORMAT, version=VERSION, next_id=c.next_id, hosts_sequence=c.hosts_sequence,
                    target_np=c.target_np, finishing=c.finishing, generations=c.generations, resets=c.resets,
                    steps=c.steps, outcome=c.outcome)
    return job.model_dump()


def _every_value(saved: SavedJob, snap: Snapshots) -> dict[str, dict[str, Any]]:
    """Every key's value, from a look at every host and worker (reusing what still holds)."""
    fresh: dict[str, tuple[Revised, int, dict[str, Any], int]] = {}
    values: dict[str, dict[str, Any]] = {JOB_KEY: _job_value(saved)}
    snap.add(values, ((HOSTS + name, host) for name, host in saved.hosts.items()), _host_value, fresh)
    generation = saved.generation
    members = generation.member_set if generation is not None else frozenset()
    kept = ((WORKERS + i, w) for i, w in saved.workers.items() if w.live or i in members)
    current = generation.number if generation is not None else 0
    snap.add(values, kept, lambda w: _worker_value(w, current, members, snap.place(w), _left(saved.hosts, w)), fresh,
             context=current)
    if generation is not None:
        snap.add(values, [(GENERATION_KEY, generation)], _generation_value, fresh)
        if snap.runs[0] is not generation:  # (a generation's members never change)
            snap.runs = (generation, _member_runs(generation))
        values.update(snap.runs[1])
    snap.built = fresh  # keys not asked for this time are forgotten
    if len(snap.places) > 2 * len(saved.workers):
        snap.places = {i: kept for i, kept in snap.places.items() if i in saved.workers}
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
    if raw.get("format") != FORMAT or raw.get("version") not in READABLE:
        raise IncompatibleState(
            f"the store holds a job in format {raw.get('format')!r} version {raw.get('version')!r}; this ringmaster "
            f"reads {FORMAT!r} versions {', '.join(map(str, READABLE))}. Finish that job with the ringmaster that "
            "started it, or use another prefix in --store"
        )
    skipped: list[tuple[str, str]] = []
    try:
        job = JobRecord.model_validate(raw)
        hosts = {
            key.removeprefix(HOSTS): _host(key.removeprefix(HOSTS), HostRecord.model_validate(v))
            for key, v in values.items() if key.startswith(HOSTS) and _name_fits(key, skipped)
        }
        generation_record = (
            GenerationRecord.model_validate(values[GENERATION_KEY]) if GENERATION_KEY in values else None
        )
        current = generation_record.number if generation_record is not None else 0
        member_ids, order = _members(values, generation_record.size) if generation_record is not None else ([], ())
        listed = frozenset(member_ids)
        workers = {
            key.removeprefix(WORKERS): _worker(key.removeprefix(WORKERS), WorkerRecord.model_validate(v), current,
                                               listed, hosts)
            for key, v in values.items() if key.startswith(WORKERS) and _name_fits(key, skipped, v.get("host"))
        }
        generation = None
        if generation_record is not None:
            missing = [i for i in member_ids if i not in workers]
            if missing:
                raise IncompatibleState(f"the job in the store lacks the records of members {', '.join(missing[:5])}")
            generation = _generation(generation_record, member_ids, order, workers)
        # (a member of an earlier generation that is stopping is one leaving: it is in no run)
        strays = [i for i, w in workers.items()
                  if w.phase is Phase.MEMBER and i not in listed and not (w.stopping and w.generation != current)]
        if strays:
            raise IncompatibleState(f"workers {', '.join(strays[:5])} are members of no generation the store holds")
    except (ValidationError, ValueError, TypeError) as exc:
        raise IncompatibleState(f"the job in the store is damaged or from another version: {exc}") from None
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
                drain=drain, joined=r.joined, left=r.left)


def _worker(worker_id: str, r: WorkerRecord, current: int, listed: frozenset[str], hosts: dict[str, Host]) -> Worker:
    """The worker `r` says, `listed` the current generation's members: one kept as a member but
    in no run, on a host that speaks for its leavers (`left`), is that generation's and stopping."""
    generation, stopping = (r.generation if r.generation is not None else current), r.stopping
    host = hosts.get(r.host)
    if r.phase is None and r.generation is None and worker_id not in listed and host is not None \
            and 0 < host.left < current:  # (a mark at or past the current generation is not one we wrote)
        generation, stopping = host.left, True
    return Worker(
        worker_id, r.host, r.slot, dict(r.place), phase=Phase(r.phase) if r.phase is not None else Phase.MEMBER,
        registered=r.registered, elastic=r.elastic, stopping=stopping, failed=r.failed, done=r.done,
        generation=generation, holds_commit=True,
    )


def _members(values: dict[str, dict[str, Any]], size: int) -> tuple[list[str], tuple[int, ...]]:
    """The generation's member ids in rank order, and their order keys, from its `members/` runs."""
    runs: list[tuple[int, MemberRunRecord]] = []
    for key, value in values.items():
        if key.startswith(MEMBERS):
            digits = key.removeprefix(MEMBERS)
            if not (digits.isascii() and digits.isdigit() and len(digits) <= 16 and int(digits) < MAX_ORDER_KEY):
                raise IncompatibleState(f"the store holds a member run {key[:80]!r} whose key is not an order key")
            runs.append((int(digits), MemberRunRecord.model_validate(value)))
    runs.sort(key=lambda run: run[0])
    member_ids: list[str] = []
    order: list[int] = []
    for (first, run), after in zip(runs, [*runs[1:], None]):
        if after is not None and first + len(run.workers) > after[0]:
            raise IncompatibleState(f"the member runs at order keys {first} and {after[0]} overlap")
        member_ids += [f"{run.host}/{n}" for n in run.workers]
        order += range(first, first + len(run.workers))
    if len(member_ids) != size:
        raise IncompatibleState(f"the generation has {size} members but its runs in the store list {len(member_ids)} "
                                "(they were written in part, or by something else)")
    return member_ids, tuple(order)


def _generation(r: GenerationRecord, member_ids: list[str], order: tuple[int, ...],
                workers: dict[str, Worker]) -> Generation:
    """The generation with its members' ranks computed again, as they were when it formed
    (a member listed twice is refused by `assign_ranks`)."""
    members: list[RankAssignment] = assign_ranks([WorkerSlot(i, workers[i].host) for i in member_ids], [])
    return Generation(r.number, members, r.cause, r.store_prefix, over=r.over,
                      update_sequence=r.update_sequence, hosts_baseline=r.hosts_baseline,
                      announced_sequence=r.announced_sequence, order=order)
