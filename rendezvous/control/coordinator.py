"""The rendezvous' decisions for one job: its inputs, the facts they observed, and the clock.

`Coordinator` wires the job's parts together: the hosts it runs on (`host_pool.HostPool`), its
records and the changes every decision makes to them (`job.Job`), and how its next generation
comes about (`formation.Formation`). It does no I/O: each method is given the time (`now`,
monotonic seconds on the rendezvous' own clock), and what it wants said to agents and workers
goes into an outbox of typed effects (`effects`) that the server drains after every call and
turns into protobuf; what the pool wants done to hosts (start or stop an agent) into another.
So every rule is tested by calling methods with chosen times, without processes.

Inputs only check and record: what calls for a decision is queued as a fact (`facts`), by the
pool's inputs and the job's alike, in the order they came; `settle` (and `tick`) then decides on
the facts and reconciles the job. What differs between plain and elastic jobs is asked of their
policies (`policies`). The caller settles once per batch of inputs (the gRPC layer: once per
turn of its event loop), because acting looks at every host and worker: settling after each of
the N `Ready` calls that end a generation would cost O(N^2), with it the whole batch costs O(N).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from ringmaster.common.errors import Refused
from ringmaster.common.events import Event, Kind
from ringmaster.discovery import Blacklist
from ringmaster.rendezvous.control.drains import Drains
from ringmaster.rendezvous.control.effects import Effect, EndGeneration, StopAgent
from ringmaster.rendezvous.control.fact_decisions import FactDecisions
from ringmaster.rendezvous.control.facts import (
    Fact,
    GenerationFailed,
    SessionClosed,
    TrainingReturned,
    WorkerExited,
)
from ringmaster.rendezvous.control.formation import Formation, QuietInputs, StoreFactory
from ringmaster.rendezvous.control.heartbeat_pace import Pace
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.liveness import Silence, judge_silence
from ringmaster.rendezvous.control.preemption import Preemption
from ringmaster.rendezvous.control.records import (
    Drain,
    DrainSource,
    Generation,
    Host,
    JobOutcome,
    Phase,
    ResetCause,
    SavedJob,
    Summary,
    Worker,
)
from ringmaster.rendezvous.control.resumption import resume_job
from ringmaster.rendezvous.control.straggler_action import StragglerAction
from ringmaster.rendezvous.control.stragglers import Straggler
from ringmaster.rendezvous.control.view import ALL_ROWS, JobView, Page, job_view
from ringmaster.settings import JobSettings


@dataclass(frozen=True)
class RingStoreAddress:
    """Where the torch.distributed TCPStore of the rings listens (not the state store)."""

    host: str
    port: int


class Coordinator:
    def __init__(
        self,
        settings: JobSettings,
        rendezvous_address: str,
        ring_store: RingStoreAddress,
        plain_store_factory: StoreFactory,
        blacklist: Blacklist | None = None,
        on_event: Callable[[Event], None] | None = None,
        launches_agents: bool = False,
    ) -> None:
        """`launches_agents`: the server starts the hosts' agents (`ringmaster run`), so the pool
        asks for them (`LaunchAgent`)."""
        self.settings = settings
        self.rendezvous_address = rendezvous_address
        self.ring_store = ring_store
        self._facts: deque[Fact] = deque()  # observed by inputs, decided on by `settle`
        self.pool = HostPool(settings, lambda now, kind, **fields: self.job.emit(now, kind, **fields), self._observe,
                             blacklist, launches_agents)
        self.job = Job(settings, self.pool, (ring_store.host, ring_store.port), on_event)
        self.formation = Formation(self.job, rendezvous_address, plain_store_factory)
        self.drains = Drains(self.job)
        self.decisions = FactDecisions(self.job, self.pool, self.formation, self.drains)
        self.stragglers = StragglerAction(self.job, self.pool, self.drains)
        self.preemption = Preemption(self.job, self.pool, self.drains)
        self._unsettled = False  # inputs arrived that `settle` has not acted on yet
        self._quiet = QuietInputs()  # inputs that need no pass (`Formation.quiet_inputs`)
        self._failure_reported = -1  # the generation whose failure a report has told already
        self._agents_stopped = False  # told every agent to stop, the job having ended

    # ------------------------------------------------------------------ the job, as read
    @property
    def pace(self) -> Pace:
        """The heartbeat pace asked of agents and workers now (`HostPool.repace`)."""
        return self.pool.pace

    @property
    def workers(self) -> dict[str, Worker]:
        return self.job.workers

    @property
    def generation(self) -> Generation | None:
        return self.job.generation

    @property
    def outcome(self) -> JobOutcome | None:
        return self.job.outcome

    @property
    def summary(self) -> Summary:
        return self.job.summary

    @property
    def target_np(self) -> int | None:
        return self.job.target_np

    @property
    def limit(self) -> int | None:
        return self.job.limit

    @property
    def generation_formed_at(self) -> float:
        return self.job.generation_formed_at

    def live_workers(self) -> list[Worker]:
        return list(self.job.live_workers())

    def capacity(self, now: float) -> int:
        return self.job.capacity(now)

    def hosts_wanted(self, now: float) -> list[str]:
        return self.formation.hosts_wanted(now)

    def view(self, now: float, page: Page = ALL_ROWS) -> JobView:
        """The job as readers see it now: one immutable value (the status, the metrics, ...),
        listing the hosts and workers of `page`."""
        return job_view(self.job, self.pool, now, page)

    def drain(self) -> list[Effect]:
        """What to say to agents and workers, and what to do to hosts, since the last drain.
        The pool serves this one job: once the job has ended, its agents stop too."""
        out: list[Effect] = [*self.job.outbox, *self.pool.drain()]
        self.job.outbox = []
        outcome = self.job.outcome
        if outcome is not None and not self._agents_stopped:
            self._agents_stopped = True
            out += [StopAgent(h.name, outcome.message) for h in self.pool.hosts.values() if h.agent_connected]
        return out

    # ------------------------------------------------------------------ inputs: hosts and agents
    def set_hosts(self, hosts: Mapping[str, int], now: float) -> None:
        """Discovery's latest good host set."""
        first = self.pool.first_discovery_at is None
        change = self.pool.set_hosts(hosts, now)
        if first:
            self.job.summary.started_at = now
        if change:
            self.job.causes.hosts_changed("discovery", change)
        self._unsettled = True

    def discovery_failed(self, message: str, now: float) -> None:
        self.pool.discovery_failed(message, now)

    def agent_connected(self, host: str, pid: int, now: float, running: list[str] | None = None,
                        incarnation: str = "", slots: int = 0, version: str | None = None) -> None:
        """An agent opened its session (`slots`: what it offers, for `--hosts-from-agents`;
        `version`: its Ringmaster version, None where the caller does not say)."""
        self.pool.agent_connected(host, pid, now, running, incarnation, slots, version)

    def agent_launch_failed(self, host: str, reason: str, now: float) -> None:
        self.pool.agent_launch_failed(host, reason, now)

    def agent_process_ended(self, host: str, how: str, now: float) -> None:
        self.pool.agent_process_ended(host, how, now)

    def agent_heartbeat(self, host: str, now: float) -> None:
        self.pool.agent_heartbeat(host, now)

    def agent_disconnected(self, host: str, now: float, reason: str = "closed its connection",
                           silent: bool = False) -> None:
        self.pool.agent_disconnected(host, now, reason, silent)

    def worker_exited(self, host: str, worker_id: str, exit_code: int, signal_number: int, stopped_by_agent: bool,
                      now: float, output: str = "") -> None:
        """A worker process exited (its agent's report, with its last words after an error)."""
        if worker_id in self.job.workers:
            self._observe(WorkerExited(host, worker_id, exit_code, signal_number, stopped_by_agent, output[:1000]))

    # ------------------------------------------------------------------ inputs: workers
    def worker_connected(self, worker_id: str, pid: int, now: float, waiting_after: int | None = None,
                         failure: str = "", elastic: bool = False) -> None:
        """A worker opened its session; `Refused` if it is unknown or gone.
        A reconnecting worker that waits for a new generation says so (`waiting_after`)."""
        job = self.job
        worker = job.workers.get(worker_id)
        if worker is None:
            raise Refused(f"worker {worker_id!r} is not part of this job")
        if not worker.live or worker.stopping:
            raise Refused(f"worker {worker_id} is being stopped")
        placed_first = worker.phase is Phase.READY or (worker.phase is Phase.MEMBER and not worker.registered)
        worker.registered, worker.pid, worker.last_heartbeat = True, pid, now
        job.emit(now, Kind.WORKER_CONNECTED, worker=worker_id, pid=pid)
        if worker.phase is Phase.SPAWNING:
            worker.move(Phase.MEMBER if job.is_member(worker) else Phase.WARMING)
        gen = job.generation
        if worker.phase is Phase.WARMING and worker.generation and (gen is None or gen.number != worker.generation):
            # Started for a generation that failed and was followed before it connected (a job
            # launched elastic does not stop such a worker): it joins a later one as a newcomer.
            job.outbox.append(EndGeneration(worker_id, worker.generation,
                                            f"generation {worker.generation} ended before this worker connected",
                                            rejoin=False))
        self.formation.updates.retell(worker)
        placed = (
            worker.phase is Phase.MEMBER and gen is not None and gen.over is None and gen.number > (waiting_after or 0)
        )
        if waiting_after is not None and not placed:
            self.worker_ready(worker_id, waiting_after, failure, elastic, now)
            return
        if waiting_after is None and placed_first and (gen is None or (gen.over is None and not gen.update_sequence)):
            # A newcomer whose `Ready` (carried by its agent, another way in) or even its place
            # came before its session did: its session opening decides nothing (512 newcomers
            # under load were 20 passes over a 2,048-host job).
            return
        connecting = self._quiet.connecting
        if waiting_after is None and QuietInputs.passed_over(worker_id, connecting, connecting):
            return  # (a member of a starting generation, not the last to connect)
        if waiting_after is None and self._quiet.announced and worker_id in self._quiet.warming:
            return  # (a newcomer the members were told of: it warms up, and its `Ready` counts)
        self._unsettled = True

    def worker_disconnected(self, worker_id: str, now: float) -> None:
        """A worker's session closed. That of a worker retired, gone or done decides nothing
        (`Job.on_session_closed`) and sets off no pass: half of a 2,048-host job leaving closed
        8,192 retired workers' sessions, a pass each while the staying members' `Ready`s waited."""
        worker = self.job.workers.get(worker_id)
        if worker is not None and worker.live and not worker.stopping and not worker.done:
            self._observe(SessionClosed(worker_id))

    def worker_heartbeat(self, worker_id: str, commits: int, elastic: bool, now: float,
                         steps_since_commit: int = 0, heard_at: float | None = None) -> None:
        """A worker's heartbeat; `heard_at`: when its agent received it, for one the agent relayed."""
        worker = self.job.workers.get(worker_id)
        if worker is None:
            return
        worker.last_heartbeat = now if heard_at is None else max(worker.last_heartbeat, min(heard_at, now))
        worker.steps_since_commit = min(max(0, steps_since_commit), 1 << 40)  # (bounded: it is input)
        self.job.note_commits(worker, commits, now)
        if elastic and not worker.elastic:
            worker.elastic = True
            waiting = self._quiet.not_elastic
            if self._quiet.announced and worker_id in self._quiet.warming:
                return  # (a newcomer warming up: what counts is its `Ready`)
            if not QuietInputs.passed_over(worker_id, waiting, waiting):
                self._unsettled = True  # (the first member inside hvd.elastic.run, or the last)

    def workers_busy(self, host: str, worker_ids: Sequence[str], now: float) -> None:
        """`host`'s agent says these workers' processes are busy (`liveness`): only its own are taken."""
        workers = self.job.workers
        for worker_id in worker_ids:
            worker = workers.get(worker_id)
            if worker is not None and worker.host == host:
                worker.busy_at = now

    def worker_ready(self, worker_id: str, after_generation: int, failure: str, elastic: bool, now: float,
                     awaits_hosts: int = 0) -> None:
        """A worker asks for a generation after `after_generation`; `awaits_hosts`: the
        announcement it reset for (its script awaited the newcomers: `HostUpdates.awaits_announced`)."""
        worker = self.job.workers.get(worker_id)
        if worker is None:
            raise Refused(f"worker {worker_id!r} is not part of this job")
        if not worker.live:
            raise Refused(f"worker {worker_id} was already counted as failed ({worker.failed})")
        if worker.stopping:
            raise Refused(f"worker {worker_id} is leaving the job")
        asked_before = worker.phase is Phase.READY and (worker.elastic or not elastic)
        worker.elastic = worker.elastic or elastic
        self.job.emit(now, Kind.WORKER_READY, worker=worker_id, after_generation=after_generation, failure=failure)
        news = bool(failure) and self._news_of_failure(after_generation)
        if news:
            self._observe(GenerationFailed(worker_id, after_generation, failure))
        if worker.phase is Phase.MEMBER and worker.generation > after_generation:
            worker.last_heartbeat = now
            return  # it asks for what it holds already (assigned before it asked: `Formation._rejoins_at_once`)
        if asked_before and not news and not awaits_hosts:
            worker.last_heartbeat = now
            return  # asked again (its session reopened saying it waits, a `Ready` said twice): nothing new
        if awaits_hosts and not failure and worker.generation == after_generation:
            self.formation.updates.awaits_announced(worker, awaits_hosts, now)
        reached = self.formation.updates.reached(worker, after_generation, failure, now)
        if worker.phase is not Phase.EXITED:
            worker.move(Phase.READY)
            worker.ready_at = now
        worker.last_heartbeat = now
        if reached:
            self._unsettled = True  # (every member is at the update's commit: the next ring forms now)
            return
        if not news and QuietInputs.passed_over(worker_id, self._quiet.quiet_ready, self._quiet.waiting):
            return  # (the generation still waits for others: no pass needed)
        if not news and QuietInputs.passed_over(worker_id, self._quiet.warming, self._quiet.warming):
            return  # (a newcomer warm while others still warm up: the host update waits for the last)
        self._unsettled = True

    def _news_of_failure(self, generation: int) -> bool:
        """Whether a worker's report that `generation` failed can change anything: it is the
        current generation, still running, and no report of its failure waits to be decided on.
        The survivors of a lost host each report the failure their ring saw; each report after
        the first set off a pass that decided nothing (109 passes, 20 s of the rendezvous' CPU in
        a 72 s recovery at 4,096 x 8)."""
        gen = self.job.generation
        if gen is None or gen.number != generation or gen.over is not None or self._failure_reported == generation:
            return False
        self._failure_reported = generation
        return True

    def worker_done(self, worker_id: str, commits: int, now: float, warning: str = "") -> None:
        """The worker's training function returned; `warning` is what the job's end must say."""
        job = self.job
        worker = job.workers.get(worker_id)
        if worker is None or worker.done:
            return
        job.note_commits(worker, commits, now)
        worker.done = True
        job.emit(now, Kind.WORKER_RETURNED, worker=worker_id)
        if warning:  # (the final checkpoint did not reach the disk: the job's end is a failure)
            job.emit(now, Kind.WORKER_WARNING, worker=worker_id, warning=warning)
            job.summary.warnings.append(f"worker {worker_id}: {warning}")
            job.summary.unfinished.append(f"worker {worker_id}: {warning}")
        self._observe(TrainingReturned(worker_id))

    def worker_fatal(self, worker_id: str, cause: str, now: float) -> None:
        """A worker met a cause of the job's own that no host gets past (a refused checkpoint, one
        that does not fit the model): the job fails at once with it, and no host is blamed (its
        workers' exits that follow change nothing: the job has ended)."""
        job = self.job
        if worker_id not in job.workers or job.outcome is not None:
            return
        job.fail(f"worker {worker_id} cannot go on: {cause}", now)
        self._unsettled = True

    def scale(self, np: int, now: float) -> None:
        """Ask for a world size of `np` workers (as slots allow); `Refused`, saying why, when it cannot be."""
        if self.job.outcome is not None:
            raise Refused("the job has already ended")
        if np < self.settings.min_np:
            raise Refused(f"cannot scale to {np} workers: --min-np is {self.settings.min_np}")
        if self.settings.max_np is not None and np > self.settings.max_np:
            raise Refused(f"cannot scale to {np} workers: --max-np is {self.settings.max_np}")
        if np % self.settings.group_size:
            raise Refused(f"cannot scale to {np} workers: the job trains in groups of {self.settings.group_size} "
                          "(--group-size); ask for a multiple of it")
        self.job.target_np = np
        self.job.emit(now, Kind.SCALE_REQUESTED, np=np)
        self.job.causes.add(f"scaled to {np}", ResetCause.SCALE)
        self._unsettled = True

    def drain_host(self, host: str, deadline_s: float, now: float, source: DrainSource = DrainSource.OPERATOR,
                   reason: str = "", incarnation: str = "") -> Drain:
        """Take `host` out politely: its workers leave at their next commit, within `deadline_s`
        (`drains`); `Refused`, saying why, for an unknown host or a bad deadline."""
        drain = self.drains.request(host, source, deadline_s, reason, now, incarnation)
        self._unsettled = True
        return drain

    def stragglers_seen(self, found: list[Straggler], now: float) -> None:
        """The straggler check found these hosts slow (`straggler_action`)."""
        if self.stragglers.seen(found, now):
            self._unsettled = True

    def undrain_host(self, host: str, now: float, source: DrainSource = DrainSource.OPERATOR,
                     why: str = "undrained") -> bool:
        """Let a drained host back in (a withdrawn notice leaves an operator's drain: False)."""
        ended = self.drains.withdraw(host, source, now, why)
        self._unsettled = True
        return ended

    def preempt(self, reason: str, deadline_s: float, now: float) -> None:
        """The whole job is taken (`preemption`): every host drains, then the job ends as preempted."""
        if self.preemption.take(reason, deadline_s, now):
            self._unsettled = True

    def abort(self, reason: str, now: float) -> None:
        """End the job: the user stopped it (SIGINT, SIGTERM)."""
        self.job.end_job(JobOutcome(False, reason, interrupted=True), now)

    # ------------------------------------------------------------------ the store
    def saved(self) -> SavedJob:
        """The job as a store keeps it (`state/job_record` turns it into keys)."""
        return SavedJob(self.job.counters(), self.pool.hosts, self.job.workers, self.job.generation)

    def resume(self, saved: SavedJob, now: float, agents_survive: bool = True) -> None:
        """Carry on the job a previous rendezvous process kept in the store (`resumption`)."""
        store = f"{self.ring_store.host}:{self.ring_store.port}"
        if resume_job(self.job, self.pool, self.drains, saved, now, self.rendezvous_address, store, agents_survive):
            self._unsettled = True

    # ------------------------------------------------------------------ the clock
    def settle(self, now: float) -> bool:
        """Act on the inputs recorded since the last `settle` or `tick`. False: there were none."""
        if not self._unsettled:
            return False
        self._reconcile(now)
        return True

    def tick(self, now: float) -> None:
        """Called every few hundred milliseconds: timeouts that no message announces."""
        job = self.job
        if job.outcome is not None:
            return
        liveness = self.pool.tick(now)  # a stall or isolation of the rendezvous itself, hosts' silence
        if liveness.stalled or liveness.rejoined:  # it was deaf, the workers were not dead
            for worker in job.workers.values():
                worker.last_heartbeat = max(worker.last_heartbeat, now)
        if liveness.stalled:
            for worker_id in job.exit_awaited:
                job.exit_awaited[worker_id] = max(job.exit_awaited[worker_id], now)
        self._decide(now)  # a lost host before its workers' own silence: the host is the cause
        for name in self.pool.forget_departed(now, job.busy_hosts()):
            self.formation.sent_to_agents.pop(name, None)
            self._unsettled = True
        live = job.live_workers()
        self.pool.repace(sum(1 for w in live if w.registered))
        if not liveness.isolated:
            for worker, silence in silent_workers(live, self.pool.hosts, self.pace,
                                                  self.settings.busy_timeout_s, now):
                job.worker_failed(worker, silence.reason, now, blame_host=not silence.busy, host_lost=False)
        self._reconcile(now)

    def _reconcile(self, now: float) -> None:
        """Decide on the facts, then bring the job one step closer to what they call for."""
        if self.pool.first_discovery_at is None:
            # Neither discovered nor resumed yet (an agent's hello can come first): deciding now
            # would tell that agent to run nothing and stop the workers a resumed job still has.
            return
        self._unsettled = False
        self._quiet = QuietInputs()
        self._decide(now)
        if self.job.outcome is not None:
            return
        self.drains.settle(now, finish=False)  # (first: workers it stops are published by the formation)
        if self.job.outcome is not None:
            return
        self.formation.reconcile(now)
        self.drains.settle(now)  # (then drains are done: an agent that asked to go is told so last)
        self.preemption.end_when_left(now)
        if self.job.outcome is None:
            self.pool.reconcile_agents(self.hosts_wanted(now), self.job.busy_hosts())
        if self.job.outcome is None:
            self._quiet = self.formation.quiet_inputs(now)

    # ------------------------------------------------------------------ deciding on facts
    def _observe(self, fact: Fact) -> None:
        self._facts.append(fact)
        self._unsettled = True

    def _decide(self, now: float) -> None:
        """Decide on the facts the inputs observed, in the order they came (`fact_decisions`)."""
        while self._facts:
            if self.decisions.decide(self._facts.popleft(), now):
                self._unsettled = True


def silent_workers(workers: Iterable[Worker], hosts: Mapping[str, Host], pace: Pace, busy_timeout_s: float,
                   now: float) -> list[tuple[Worker, Silence]]:
    """The workers whose silence counts as their failure now (a busy one's is never its host's
    fault: `Silence.busy`). A worker whose training function returned goes quiet as its process
    winds down (seconds on a loaded machine): only its silence past --busy-timeout is a hang."""
    found = []
    finished = max(pace.worker_timeout_s, busy_timeout_s)
    heard_since = now - pace.worker_timeout_s  # (the shorter limit: one look through the rest)
    for worker in [w for w in workers if w.last_heartbeat < heard_since]:
        limit = finished if worker.done else pace.worker_timeout_s
        if worker.registered and worker.live and not worker.stopping and now - worker.last_heartbeat > limit:
            host = hosts.get(worker.host)
            agent_silent = now - host.last_heartbeat if host is not None and host.agent_connected else None
            silence = judge_silence(now - worker.last_heartbeat, now - worker.busy_at if worker.busy_at else None,
                                    limit, busy_timeout_s, pace.agent_s, agent_silent, pace.agent_timeout_s)
            if silence.failed:
                found.append((worker, silence))
    return found
