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
from typing import Callable, Mapping, Sequence

from ringmaster.common.errors import Refused
from ringmaster.common.events import Event, Kind
from ringmaster.common.reconnect import LONGEST_GAP_S
from ringmaster.discovery import Blacklist, HostDiff
from ringmaster.rendezvous.control.drains import Drains
from ringmaster.rendezvous.control.effects import AnnounceHosts, Effect, EndGeneration, StopAgent, UpdateHosts
from ringmaster.rendezvous.control.facts import (
    AgentConnected,
    AgentLost,
    AgentUnreachable,
    Fact,
    GenerationFailed,
    HostsJoined,
    SessionClosed,
    TrainingReturned,
    WorkerExited,
)
from ringmaster.rendezvous.control.formation import Formation, QuietInputs, StoreFactory
from ringmaster.rendezvous.control.heartbeat_pace import Pace, pace
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.liveness import judge_silence
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
from ringmaster.rendezvous.control.stragglers import Straggler, replacing_pays
from ringmaster.rendezvous.control.view import ALL_ROWS, JobView, Page, job_view
from ringmaster.rendezvous.control.worker_env import RANK_ENV_NAMES, base_env
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
        self._unsettled = False  # inputs arrived that `settle` has not acted on yet
        self._quiet = QuietInputs()  # inputs that need no pass (`Formation.quiet_inputs`)
        self._failure_reported = -1  # the generation whose failure a report has told already
        self._stragglers_told: set[tuple[int, str]] = set()  # (generation, host) of stragglers reported
        #: Heartbeat intervals asked of agents and workers (answered to each heartbeat), by job size.
        self.pace: Pace = pace(settings.heartbeat_interval_s, settings.heartbeat_timeout_s, 0, 0,
                               settings.heartbeat_relay)
        self._agents_stopped = False  # told every agent to stop, the job having ended
        self.preempted_for: str | None = None  # why the whole job was taken (`preempt`)

    # ------------------------------------------------------------------ the job, as read
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
        return self.job.live_workers()

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
            self._hosts_changed("discovery", change)
        self._unsettled = True

    def _hosts_changed(self, source: str, change: HostDiff) -> None:
        """The host set changed (`source`: who said so): the cause of the next generation."""
        kinds = set()
        if change.added or any(new > old for old, new in change.resized.values()):
            kinds.add(ResetCause.HOST_ADDED)
        if change.removed or any(new < old for old, new in change.resized.values()):
            kinds.add(ResetCause.HOST_REMOVED)
        self.job.causes.add(f"{source} {change.describe()}", *sorted(kinds, key=lambda k: k.value))

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
        worker.registered, worker.pid, worker.last_heartbeat = True, pid, now
        job.emit(now, Kind.WORKER_CONNECTED, worker=worker_id, pid=pid)
        if worker.phase is Phase.SPAWNING:
            worker.phase = Phase.MEMBER if job.is_member(worker) else Phase.WARMING
        gen = job.generation
        if worker.phase is Phase.WARMING and worker.generation and (gen is None or gen.number != worker.generation):
            # Started for a generation that failed and was followed before it connected (a job
            # launched elastic does not stop such a worker): it joins a later one as a newcomer.
            job.outbox.append(EndGeneration(worker_id, worker.generation,
                                            f"generation {worker.generation} ended before this worker connected",
                                            rejoin=False))
        if worker.phase is Phase.MEMBER and gen is not None:
            if gen.over is not None:
                job.outbox.append(EndGeneration(worker_id, gen.number, gen.over, rejoin=worker.elastic))
            else:
                job.send_assignment(worker)
                if gen.update_sequence and worker.phase is Phase.MEMBER:
                    # A host update went out while its session was closed: say it again, or it
                    # trains on alone at its next commit while the others wait for it.
                    job.outbox.append(UpdateHosts(worker_id, gen.update_sequence,
                                                  "the hosts changed while this worker was reconnecting", False))
                elif gen.announced_sequence and worker.phase is Phase.MEMBER:
                    job.outbox.append(AnnounceHosts(worker_id, gen.announced_sequence,
                                                    "newcomers were announced while this worker was reconnecting"))
        placed = (
            worker.phase is Phase.MEMBER and gen is not None and gen.over is None and gen.number > (waiting_after or 0)
        )
        if waiting_after is not None and not placed:
            self.worker_ready(worker_id, waiting_after, failure, elastic, now)
            return
        connecting = self._quiet.connecting
        if waiting_after is None and QuietInputs.passed_over(worker_id, connecting, connecting):
            return  # (a member of a starting generation, not the last to connect)
        self._unsettled = True

    def worker_disconnected(self, worker_id: str, now: float) -> None:
        """A worker's session closed."""
        if worker_id in self.job.workers:
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
        announcement it reset for (its script awaited the newcomers: `Formation.awaits_announced`)."""
        worker = self.job.workers.get(worker_id)
        if worker is None:
            raise Refused(f"worker {worker_id!r} is not part of this job")
        if not worker.live:
            raise Refused(f"worker {worker_id} was already counted as failed ({worker.failed})")
        if worker.stopping:
            raise Refused(f"worker {worker_id} is leaving the job")
        worker.elastic = worker.elastic or elastic
        self.job.emit(now, Kind.WORKER_READY, worker=worker_id, after_generation=after_generation, failure=failure)
        news = bool(failure) and self._news_of_failure(after_generation)
        if news:
            self._observe(GenerationFailed(worker_id, after_generation, failure))
        if worker.phase is Phase.MEMBER and worker.generation > after_generation:
            worker.last_heartbeat = now
            return  # it asks for what it holds already (assigned before it asked: `Formation._rejoins_at_once`)
        if awaits_hosts and not failure and worker.generation == after_generation:
            self.formation.awaits_announced(worker, awaits_hosts, now)
        if worker.phase is not Phase.EXITED:
            worker.phase = Phase.READY
            worker.ready_at = now
        worker.last_heartbeat = now
        if not news and QuietInputs.passed_over(worker_id, self._quiet.quiet_ready, self._quiet.waiting):
            return  # (the generation still waits for others: no pass needed)
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
        """The straggler check found these hosts slow (`stragglers`). Each is told once per
        generation; with `--stragglers replace` it is drained (its workers leave at their next
        commit) where the job is faster without it: another host takes its workers, or the job
        runs faster on the rest."""
        gen = self.job.generation
        if gen is None or self.job.outcome is not None:
            return
        members = {a.host for a in gen.members}  # (a host with only warming workers is spare)
        spare = sum(
            h.slots
            for h in self.pool.ordered_hosts()
            if h.name not in members and h.drain is None and not self.pool.blacklist.is_blacklisted(h.name, now)
        )
        for straggler in found:
            if (gen.number, straggler.host) in self._stragglers_told:
                continue
            self._stragglers_told.add((gen.number, straggler.host))
            on_host = sum(1 for a in gen.members if a.host == straggler.host)
            replace = False
            if self.settings.stragglers != "replace":
                action = "kept (--stragglers report)"
            elif replacing_pays(straggler, len(gen.members), on_host, spare):
                replace = True
                action = ("replaced: its workers leave at their next commit" +
                          (", another host takes them" if spare >= on_host else ", the job is faster on the rest"))
            else:
                action = (f"kept: no spare host for its {on_host} worker(s), and the job is not faster without them "
                          f"({len(gen.members) - on_host} of {len(gen.members)} workers)")
            self.job.emit(now, Kind.STRAGGLER_FOUND, host=straggler.host, slowdown=round(straggler.slowdown, 3),
                          pace_s=round(straggler.pace_s, 6), others_s=round(straggler.others_s, 6),
                          steps=self.settings.straggler_steps, action=action, replaced=replace, generation=gen.number)
            if replace:
                spare -= on_host
                try:
                    self.drains.request(straggler.host, DrainSource.STRAGGLER, self.settings.drain_grace_s,
                                        f"straggler, {straggler.slowdown:.2f}x slower than the other hosts", now)
                except Refused:
                    continue
                self._unsettled = True
        del_before = gen.number - 1
        self._stragglers_told = {k for k in self._stragglers_told if k[0] >= del_before}

    def undrain_host(self, host: str, now: float, source: DrainSource = DrainSource.OPERATOR,
                     why: str = "undrained") -> bool:
        """Let a drained host back in (a withdrawn notice leaves an operator's drain: False)."""
        ended = self.drains.withdraw(host, source, now, why)
        self._unsettled = True
        return ended

    def preempt(self, reason: str, deadline_s: float, now: float) -> None:
        """The whole job is taken (Slurm's `--signal=B:USR1@90`, a preemption): every host is
        drained, so its workers leave at their next commit, which rank 0 makes durable first (no
        host is left); then the job ends as preempted, to resume from that checkpoint when started
        again. Workers still there after `deadline_s` are stopped (the last durable checkpoint)."""
        if self.job.outcome is not None or self.preempted_for is not None:
            return
        self.preempted_for = reason
        self.job.emit(now, Kind.JOB_PREEMPTED, reason=reason, deadline_s=deadline_s,
                      checkpoint_dir=self.settings.checkpoint_dir or "")
        for host in list(self.pool.hosts.values()):
            if host.drain is None and (host.agent_connected or host.name in self.job.busy_hosts()):
                try:
                    self.drains.request(host.name, DrainSource.OPERATOR, deadline_s, reason, now)
                except Refused:
                    continue  # (a host that cannot be drained runs nothing to wait for)
        self._unsettled = True

    def _preempted_yet(self, now: float) -> None:
        """A preempted job ends once no worker of it is left."""
        if self.preempted_for is not None and self.job.outcome is None and not self.job.live_workers():
            where = self.settings.checkpoint_dir
            self.job.end_job(JobOutcome(False, f"preempted ({self.preempted_for}): every worker left at a commit; "
                                        + (f"started again, the job resumes from its checkpoint in {where}" if where
                                           else "no --checkpoint-dir, so started again it begins anew"),
                                        interrupted=True, preempted=True), now)

    def abort(self, reason: str, now: float) -> None:
        """End the job: the user stopped it (SIGINT, SIGTERM)."""
        self.job.end_job(JobOutcome(False, reason, interrupted=True), now)

    # ------------------------------------------------------------------ the store
    def saved(self) -> SavedJob:
        """The job as a store keeps it (`state/job_record` turns it into keys)."""
        return SavedJob(self.job.counters(), self.pool.hosts, self.job.workers, self.job.generation)

    def resume(self, saved: SavedJob, now: float, agents_survive: bool = True) -> None:
        """Carry on the job a previous rendezvous process kept in the store.

        Hosts and workers get a fresh heartbeat window to reconnect (their last heartbeats were
        on the old process's clock), counted from when the slowest of them tries again at the
        latest (`LONGEST_GAP_S`): one between two tries when this rendezvous began to serve is
        not silent, only away. Without `agents_survive` (`ringmaster run`, whose emulated
        hosts died with it) every worker is gone, so the job restarts from its checkpoint.
        """
        job, counters = self.job, saved.counters
        self.pool.resumed(saved.hosts, now, agents_survive)
        self.drains.resumed()
        job.workers, job.generation = saved.workers, saved.generation
        job.next_id, job.hosts_sequence = counters.next_id, counters.hosts_sequence
        job.target_np, job.finishing = counters.target_np, counters.finishing
        job.summary.generations, job.summary.resets, job.summary.steps = (
            counters.generations,
            counters.resets,
            counters.steps,
        )
        job.summary.started_at = now
        job.generation_started = now - self.settings.crash_loop_window_s  # not a quick failure
        store = f"{self.ring_store.host}:{self.ring_store.port}"
        for worker in job.workers.values():
            worker.ready_at = now
            worker.last_heartbeat = now + LONGEST_GAP_S
            # The store is data: a worker's environment is this job's own (its settings, this
            # rendezvous and ring store), with only its place in the ring taken from the record.
            place = {name: value for name, value in worker.env.items() if name in RANK_ENV_NAMES}
            worker.env = {**base_env(worker.worker_id, worker.host, worker.slot, self.rendezvous_address, store,
                                     self.settings), **place}
            if not agents_survive and worker.live:
                worker.phase = Phase.EXITED
        number = job.generation.number if job.generation else 0
        live = sum(1 for w in job.workers.values() if w.live)
        job.emit(now, Kind.JOB_RESUMED, number=number, live=live,
                 hosts=sum(1 for h in self.pool.hosts.values() if h.agent_connected))
        if not agents_survive and job.generation is not None:
            job.causes.add("the previous rendezvous and its hosts ended", ResetCause.RESTART)
            job.end_generation("the previous `ringmaster run` ended with its workers", now)
        if counters.outcome is not None:
            job.end_job(JobOutcome(*counters.outcome), now)
            return
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
        self._pace_heartbeats()
        timeout = self.pace.worker_timeout_s
        for worker in [] if liveness.isolated else list(job.workers.values()):
            if worker.registered and worker.live and not worker.stopping and now - worker.last_heartbeat > timeout:
                host = self.pool.hosts.get(worker.host)
                agent_silent = now - host.last_heartbeat if host is not None and host.agent_connected else None
                silence = judge_silence(now - worker.last_heartbeat, now - worker.busy_at if worker.busy_at else None,
                                        timeout, self.settings.busy_timeout_s, self.pace.agent_s,
                                        agent_silent, self.pace.agent_timeout_s)
                if silence.failed:  # (a busy worker is never its host's fault)
                    job.worker_failed(worker, silence.reason, now, blame_host=not silence.busy, host_lost=False)
        self._reconcile(now)

    def _pace_heartbeats(self) -> None:
        """Stretch heartbeat intervals (and the silences that count as death) with the job's size."""
        # Hosts discovered count before their agents connect: the first agents in are asked for the
        # job's pace from their first answer, not for 1 s beats that wait behind everyone's hellos.
        hosts = sum(1 for h in self.pool.hosts.values() if h.agent_connected or h.discovered)
        workers = sum(1 for w in self.job.workers.values() if w.live and w.registered)
        self.pace = pace(self.settings.heartbeat_interval_s, self.settings.heartbeat_timeout_s, hosts, workers,
                         self.settings.heartbeat_relay)
        self.pool.beat_s, self.pool.silence_s = self.pace.agent_s, self.pace.agent_timeout_s

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
        self._preempted_yet(now)
        if self.job.outcome is None:
            self.pool.reconcile_agents(self.hosts_wanted(now), self.job.busy_hosts())
        if self.job.outcome is None:
            self._quiet = self.formation.quiet_inputs(now)

    # ------------------------------------------------------------------ deciding on facts
    def _observe(self, fact: Fact) -> None:
        self._facts.append(fact)
        self._unsettled = True

    def _decide(self, now: float) -> None:
        """Decide on the facts the inputs observed, in the order they came."""
        job = self.job
        while self._facts:
            fact = self._facts.popleft()
            if isinstance(fact, AgentConnected):
                self.formation.sent_to_agents.pop(fact.host, None)  # a new session needs the full picture
                self.drains.agent_connected(fact.host, fact.incarnation, now)
                job.on_agent_connected(fact, now)
            elif isinstance(fact, AgentLost):
                self.formation.sent_to_agents.pop(fact.host, None)
                job.on_agent_lost(fact, now)
            elif isinstance(fact, AgentUnreachable):
                if not self.pool.hosts.get(fact.host, Host(fact.host, 0)).agent_connected:
                    job.emit(now, Kind.HOST_UNREACHABLE, host=fact.host, reason=fact.reason)
                    job.blacklist_host(fact.host, f"its agent could not be started: {fact.reason}", now, by_itself=True)
            elif isinstance(fact, WorkerExited):
                job.on_worker_exited(fact, now)
            elif isinstance(fact, SessionClosed):
                if job.on_session_closed(fact, now):
                    self._unsettled = True
            elif isinstance(fact, GenerationFailed):
                gen = job.generation
                if gen is not None and gen.number == fact.generation and gen.over is None:
                    job.end_generation(f"worker {fact.worker_id} reported: {fact.failure}", now)
            elif isinstance(fact, TrainingReturned):
                job.start_finishing(now)
            elif isinstance(fact, HostsJoined):
                self._hosts_changed("agents", fact.change)
