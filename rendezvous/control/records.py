"""The records the coordinator keeps about hosts, workers and generations (no behaviour)."""

from __future__ import annotations

import enum
import operator
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, Iterable, Iterator

from ringmaster.common.events import Event
from ringmaster.discovery import HostDiff
from ringmaster.rendezvous.control.assignment import RankAssignment
from ringmaster.rendezvous.control.listing import listed


class ResetCause(str, enum.Enum):
    """Why a generation replaced the last one (its `causes`; the metrics count resets by them)."""

    FAILURE = "failure"  # a worker failed (crashed, killed, hung)
    HOST_LOST = "host_lost"  # a host's agent closed its session: the host or its agent died
    PARTITION = "partition"  # a host's agent fell silent without closing it: cut off (or frozen)
    HOST_ADDED = "host_added"  # discovery added a host or slots, or a host came back (cooldown over)
    HOST_REMOVED = "host_removed"  # discovery removed a host or slots
    SCALE = "scale"  # `ringmaster scale` / POST /scale
    RESTART = "restart"  # a new rendezvous took over a job whose workers had ended
    OTHER = "other"


class Phase(enum.Enum):
    """Where a worker process is in its life, as the rendezvous sees it."""

    SPAWNING = "spawning"  # asked of its agent; not registered yet (plain scripts never register)
    WARMING = "warming"  # registered (hvd.init), building its model, not waiting for a ring yet
    READY = "ready"  # waiting for a generation newer than its last one
    MEMBER = "member"  # training in the current generation
    EXITED = "exited"  # the process is gone


_S, _W, _R, _M, _X = Phase.SPAWNING, Phase.WARMING, Phase.READY, Phase.MEMBER, Phase.EXITED
#: Every move of a worker's phase, by where it goes, from where and what makes it: the one place
#: they are listed (as torch elastic's `WorkerState` lists its states). `Worker.move` refuses any
#: other: nothing leaves EXITED (a worker id is one process) and nothing goes back to SPAWNING.
PHASE_MOVES: dict[Phase, dict[Phase, str]] = {
    _W: {_S: "its session opened outside the current generation (`Coordinator.worker_connected`)",
         _R: "left over in groups: told to ask again once out of the failed generation (`Formation`)",
         _M: "left over in groups: told to ask again once out of the failed generation (`Formation`)"},
    _R: {_S: "it asked for a generation after its last one (`Coordinator.worker_ready`)",
         _W: "warmed up: it asked for its first generation (`Coordinator.worker_ready`)",
         _M: "a survivor after a reset, or at a host update, asked for the next generation (`worker_ready`)"},
    _M: {_S: "its session opened in the planned generation it was started for (`worker_connected`)",
         _W: "given a rank in the generation that formed (`Formation._next_generation`)",
         _R: "given a rank in the generation that formed (`Formation._next_generation`)",
         _M: "given a rank again: a survivor rejoined at once after a failure (`Formation._next_generation`)"},
    _X: {_S: "its process is gone", _W: "its process is gone", _R: "its process is gone",
         _M: "its process is gone"},
}


class Revised:
    """Counts assignments to its attributes. A record built from it at one count is still true
    while the count stands, so the job's record is rebuilt only for what changed since the last
    save (`job_record.Snapshots`): with 512 hosts, rebuilding every key on every change cost more
    than everything else the rendezvous does. Values held inside (a worker's `env`) are never
    changed in place after the object is first recorded."""

    revision = 0
    #: Fields the store does not keep (liveness and progress, set at every heartbeat): setting
    #: them leaves the record as it was, so a heartbeat costs the journal nothing.
    VOLATILE: ClassVar[frozenset[str]] = frozenset()

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name not in self.VOLATILE:
            self._touched()

    def _touched(self) -> None:
        """Count a change of a kept field (made by `__setattr__`, or straight into `__dict__` by
        a method that sets several at once as one change)."""
        kept = self.__dict__
        kept["revision"] = kept.get("revision", 0) + 1
        _RECORDED[0] += 1
        changed = kept.get("_changed")  # (set by the container that keeps it: `JobWorkers.changed`)
        if changed is not None:
            for into in changed:
                into[id(self)] = self


#: Changes to any record in this process (`recorded_changes`).
_RECORDED = [0]


def recorded_changes() -> int:
    """How many times a kept field of any record was set in this process: while it stands (and
    no record was added or removed), the job's record is as last saved."""
    return _RECORDED[0]


class DrainSource(str, enum.Enum):
    """Who asked for a drain, which says how long it lasts."""

    OPERATOR = "operator"  # `ringmaster drain`, POST /hosts/{name}/drain: until undrained
    SIGNAL = "signal"  # the agent got SIGTERM or SIGINT: the host goes with that agent
    NOTICE = "notice"  # a preemption notice (the agent's notice script, SIGUSR1): until withdrawn
    STRAGGLER = "straggler"  # --stragglers replace found it slow: until undrained (or a new agent for it)


@dataclass
class Drain:
    """A host being taken politely: its workers leave at their next commit, by `deadline_at`.
    `incarnation` is the agent process that asked (a signal or notice ends with that agent: a
    new agent on the host is a new machine, or the same one back). `done` once the host runs
    none of the job's workers (`host.drained` said)."""

    source: DrainSource
    reason: str
    requested_at: float
    deadline_at: float
    incarnation: str = ""
    had_workers: bool = False  # ran workers of the job when the drain began
    done: bool = False


@dataclass
class Host(Revised):
    VOLATILE: ClassVar[frozenset[str]] = frozenset({"last_heartbeat", "agent_incarnation"})

    name: str
    slots: int
    discovered: bool = True  # in the host set: listed by discovery, or joined by its agent
    joined: bool = False  # its agent joined it to the host set by connecting (`--hosts-from-agents`)
    agent_pid: int | None = None
    agent_connected: bool = False
    last_heartbeat: float = 0.0
    drain: Drain | None = None  # being drained (or drained and kept out until undrained)
    agent_incarnation: str = ""  # the connected agent process (see `Drain.incarnation`)
    #: The last generation some of its members left at the next one's forming (0: none): the
    #: store says their leaving through it, once per host, not in each leaver's record (job_record).
    left: int = 0


@dataclass
class Worker(Revised):
    VOLATILE: ClassVar[frozenset[str]] = frozenset({"last_heartbeat", "commits",
                                                    "holds_commit", "steps_since_commit", "pid",
                                                    "ready_at", "stop_requested_at", "busy_at"})

    worker_id: str
    host: str
    slot: int
    env: dict[str, str]  # complete before the worker is first recorded; replaced, never edited, after
    phase: Phase = Phase.SPAWNING
    registered: bool = False  # opened a worker session (called hvd.init)
    elastic: bool = False  # runs inside hvd.elastic.run, so it rejoins in place
    stopping: bool = False  # we asked its agent to stop it; its exit is not a failure
    steps_since_commit: int = 0  # optimizer steps a rollback would undo, as of its last heartbeat
    failed: str | None = None  # why it counts as failed
    done: bool = False  # its training function returned
    generation: int = 0  # last generation it was a member of
    last_heartbeat: float = 0.0
    ready_at: float = 0.0
    stop_requested_at: float = 0.0
    commits: int = 0
    #: It reported a commit count above 0, so it holds the job's last commit (a newcomer does once
    #: its sync took rank 0's; one whose sync was cut off holds only its initial state). The store
    #: does not keep it: a worker a standby restores counts as holding it.
    holds_commit: bool = False
    #: When its agent last said its process was busy (`liveness`; 0: never, or not this rendezvous').
    busy_at: float = 0.0
    pid: int | None = None

    #: Not exited and not counted as failed. Kept as a plain attribute, set whenever `phase` or
    #: `failed` is (every pass of the coordinator reads it of every worker: 590,000 reads in a
    #: change at 4,096 x 8, where a property cost a third of the pass).
    live: ClassVar[bool]

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        if name in ("phase", "failed"):
            self.__dict__["live"] = self.phase is not Phase.EXITED and self.failed is None

    def move(self, to: Phase) -> None:
        """Move to phase `to` (staying put is no move): one of `PHASE_MOVES`, or ValueError."""
        if to is not self.phase and self.phase not in PHASE_MOVES.get(to, {}):
            raise ValueError(f"worker {self.worker_id} cannot move from {self.phase.value} to {to.value}: "
                             "not a move of PHASE_MOVES")
        self.phase = to

    def join(self, generation: int) -> None:
        """`move(Phase.MEMBER)` and a member of `generation`, as one change: a generation of
        32,768 workers made 65,536 changes, a third of forming it at 4,096 x 8."""
        if self.phase is not Phase.MEMBER and self.phase not in PHASE_MOVES[Phase.MEMBER]:
            self.move(Phase.MEMBER)  # (refused, saying why)
        kept = self.__dict__
        kept["phase"] = Phase.MEMBER
        kept["generation"] = generation
        kept["live"] = self.failed is None
        self._touched()


class JobWorkers(dict[str, Worker]):
    """A job's workers by id, and by host: what a host's agent said (it connected, it was lost) is
    about that host's workers, found without a pass over the job (half of a 4,096-host job leaving
    at once was 2,048 such passes over 32,768 workers). A worker's host never changes; workers are
    set by id (`jobs[id] = worker`), as the job adds them."""

    def __init__(self, workers: dict[str, Worker] | None = None) -> None:
        super().__init__()
        self._by_host: dict[str, dict[str, Worker]] = {}
        self.version = 0  # counts workers set and deleted (a census is as old as this count: `census`)
        #: The workers changed, set or deleted since the job's record last took them (`take_changed`),
        #: by object: the record of a large job is brought up to date from these, not from a look
        #: at every worker (`job_record.Snapshots`).
        self.changed: dict[int, Worker] = {}
        self.takes = 0  # times `take_changed` was called
        #: The same for the census (`census.CensusKeeper`), which brings itself up to date from them.
        self.census_changed: dict[int, Worker] = {}
        self._listeners = (self.changed, self.census_changed)  # (one tuple, shared by every worker)
        #: Each worker id's place in the order of the dict (its first setting; a worker set again
        #: under the same id keeps it), which the census keeps its lists in.
        self._position: dict[str, int] = {}
        self._positions = 0
        for worker_id, worker in (workers or {}).items():
            self[worker_id] = worker

    def __setitem__(self, worker_id: str, worker: Worker) -> None:
        old = self.get(worker_id)
        if old is not None:
            if old.host != worker.host:  # (never: a worker id names its host; kept in its place otherwise)
                self._by_host.get(old.host, {}).pop(worker_id, None)
        else:
            self._position[worker_id] = self._positions
            self._positions += 1
        super().__setitem__(worker_id, worker)
        self._by_host.setdefault(worker.host, {})[worker_id] = worker
        self.version += 1
        worker.__dict__["_changed"] = self._listeners  # (not a field: set without counting as a change)
        self.changed[id(worker)] = self.census_changed[id(worker)] = worker

    def __delitem__(self, worker_id: str) -> None:
        worker = self[worker_id]
        super().__delitem__(worker_id)
        self._by_host.get(worker.host, {}).pop(worker_id, None)
        del self._position[worker_id]
        self.version += 1
        self.changed[id(worker)] = self.census_changed[id(worker)] = worker

    def position(self, worker: Worker) -> int:
        """`worker`'s place in the order the workers are listed in (`values()`)."""
        return self._position[worker.worker_id]

    def take_census_changed(self) -> list[Worker]:
        """The workers changed, set or deleted since the census last took them."""
        taken = list(self.census_changed.values())
        self.census_changed.clear()
        return taken

    def take_changed(self) -> list[Worker]:
        """The workers changed, set or deleted since the last take (a deleted or replaced one is
        no longer the job's: `self.get(w.worker_id) is not w`)."""
        taken = list(self.changed.values())
        self.changed.clear()
        self.takes += 1
        return taken

    def on(self, host: str) -> list[Worker]:
        """The workers placed on `host`, in the order they were added."""
        return list(self._by_host.get(host, {}).values())

    def hosts(self) -> Iterator[tuple[str, Iterable[Worker]]]:
        """Each host that ever had a worker, with its workers (in the order they were added)."""
        return ((host, on.values()) for host, on in self._by_host.items())


_ID_AND_HOST = operator.itemgetter(0, 1)  # (a RankAssignment's worker_id and host)


@dataclass
class Generation(Revised):
    #: (not kept: a rendezvous that takes over forms the next ring without waiting for newcomers,
    #: and the members placed unasked at a host update ask after a while: `link.py`)
    VOLATILE: ClassVar[frozenset[str]] = frozenset({"awaited_at", "update_reporter", "update_reached_at"})

    number: int
    members: list[RankAssignment]
    cause: str
    store_prefix: str
    over: str | None = None  # why it ended early (a failure), None while healthy
    update_sequence: int = 0  # the hosts-update sequence sent to its members, 0 if none
    hosts_baseline: int = 0  # the hosts-update sequence in force when it formed
    announced_sequence: int = 0  # the newcomers' announcement sent to its members (`AnnounceHosts`), 0 if none
    awaited_at: float | None = None  # when a member reset for that announcement (its script awaited it)
    update_reporter: str = ""  # the member told to report the host update's commit ("": every member asks)
    update_reached_at: float | None = None  # when a member said it reached its commit at the host update
    #: A key per member, increasing in rank order, kept by survivors from one generation to the
    #: next (`assignment.order_keys`); empty: 0, 1, 2, ... (a first generation).
    order: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.order:
            self.order = tuple(range(len(self.members)))
        self.member_ids: list[str] = [a.worker_id for a in self.members]
        self.member_set: frozenset[str] = frozenset(self.member_ids)
        self.by_worker: dict[str, RankAssignment] = {a.worker_id: a for a in self.members}
        #: (worker id, host) in rank order: what every view of the job lists (built once, not per view).
        self.member_hosts: tuple[tuple[str, str], ...] = tuple(map(_ID_AND_HOST, self.members))


class Causes:
    """Why the next generation will replace the current one, gathered until it forms: what
    happened in words (the event's and the status' `cause`) and by kind (the metrics' resets)."""

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._kinds: set[ResetCause] = set()

    def add(self, text: str, *kinds: ResetCause) -> None:
        self._texts.append(text)
        self._kinds.update(kinds)

    def hosts_changed(self, source: str, change: HostDiff) -> None:
        """The host set changed (`source`: who said so, discovery or joining agents)."""
        kinds = set()
        if change.added or any(new > old for old, new in change.resized.values()):
            kinds.add(ResetCause.HOST_ADDED)
        if change.removed or any(new < old for old, new in change.resized.values()):
            kinds.add(ResetCause.HOST_REMOVED)
        self.add(f"{source} {change.describe()}", *sorted(kinds, key=lambda k: k.value))

    def add_kinds_if_none(self, text: str, kinds: set[ResetCause]) -> None:
        """Add `text`, and `kinds` only if no cause gave kinds yet (whoever caused it said so first)."""
        self._texts.append(text)
        if not self._kinds:
            self._kinds |= kinds

    def ensure(self, text: str) -> None:
        """A reset with no cause said yet gets `text`, of kind OTHER."""
        if not self._texts:
            self._texts.append(text)
        if not self._kinds:
            self._kinds.add(ResetCause.OTHER)

    def take(self, is_reset: bool) -> tuple[str, list[str]]:
        """(the causes in words, the kinds' values) of the generation forming now, and forget them.
        The first generation (`is_reset` False) has no kinds."""
        # (bounded: the text goes into events and every member's assignment, and a mass failure says each)
        text = listed(dict.fromkeys(self._texts), separator="; ", counted="causes") or "job start"
        kinds = (sorted(kind.value for kind in self._kinds) or [ResetCause.OTHER.value]) if is_reset else []
        self._texts, self._kinds = [], set()
        return text, kinds


@dataclass
class JobOutcome:
    success: bool
    message: str
    interrupted: bool = False  # stopped by the user (Ctrl-C, SIGTERM), not failed
    preempted: bool = False  # taken whole (Slurm's preemption notice): its workers left at a durable commit


#: Events a job keeps (the newest); older ones are counted in `Summary.events_dropped`.
MAX_EVENTS = 1000


@dataclass
class JobCounters:
    """The job's counters a store keeps besides its hosts, workers and generation."""

    next_id: int
    hosts_sequence: int
    target_np: int | None
    finishing: bool
    generations: int
    resets: int
    steps: int
    outcome: tuple[bool, str] | None


@dataclass
class SavedJob:
    """Everything a rendezvous needs to carry on a job: what a store keeps (`state/job_record`
    turns it into keys and back) and what `Coordinator.resume` takes."""

    counters: JobCounters
    hosts: dict[str, Host]
    workers: dict[str, Worker]
    generation: Generation | None
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (key, why) of stored keys left out


@dataclass
class Summary:
    generations: int = 0
    resets: int = 0
    steps: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    events_dropped: int = 0
    warnings: list[str] = field(default_factory=list)  # repeated at the job's end
    #: what a worker said at its end that makes the job's end a failure although training
    #: finished (its final checkpoint did not reach the disk)
    unfinished: list[str] = field(default_factory=list)
    steps_lost: int = 0  # committed steps lost to restarts without a checkpoint
    drains: dict[str, int] = field(default_factory=dict)  # finished drains by outcome (commit, idle, deadline)

    def add_event(self, event: Event) -> None:
        """Keep the newest MAX_EVENTS: a job that runs for weeks keeps a bounded history."""
        if len(self.events) == self.events.maxlen:
            self.events_dropped += 1
        self.events.append(event)
