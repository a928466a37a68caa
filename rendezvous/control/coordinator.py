"""The rendezvous' decisions: membership, generations, failures, scaling, job end.

`Coordinator` holds the job's state and changes it only through its methods, each of which is
given the time (`now`, monotonic seconds on the rendezvous' own clock). It does no I/O: what
it wants said to agents and workers goes into an outbox of typed effects (`effects`) that the
server drains after every call and turns into protobuf. So every rule here is tested by calling methods with chosen times, without processes.

Inputs only check and record: what calls for a decision is queued as a fact (`facts`);
`settle` (and `tick`) then decides on the facts in the order they came and reconciles the job.
What differs between plain and elastic jobs is asked of their policies (`policies`). The caller settles once per
batch of inputs (the gRPC layer: once per turn of its event loop), because acting looks at
every host and worker: settling after each of the N `Ready` calls that end a generation would
cost O(N^2), with it the whole batch costs O(N).

How a generation comes about:
- *planned*: the first generation, and every generation of a job whose workers cannot rejoin in
  place (plain `torch.distributed` scripts, restarted as a whole like torchrun). Workers are
  spawned with their rank in their environment.
- *formed*: an elastic job (workers run `hvd.elastic.run`). Survivors and warmed-up newcomers
  call `Ready`; once every live member of the last generation is ready, ranks are assigned
  (survivors first, in their old order) and sent over the workers' streams.
"""

from __future__ import annotations

import logging
import math
from collections import deque
import signal
from dataclasses import dataclass
from typing import Callable, Mapping

from ringmaster.discovery import Blacklist, CooldownRange, diff_hosts
from ringmaster.rendezvous.state import job_record
from ringmaster.rendezvous.control.effects import (
    Assign, Effect, EndGeneration, EndJob, Retire, RunWorkers, StopAgent, UpdateHosts, WorkerLaunch,
)
from ringmaster.rendezvous.control.assignment import RankAssignment, WorkerSlot, assign_ranks
from ringmaster.common.errors import Refused
from ringmaster.common.events import Event, Kind
from ringmaster.rendezvous.control.facts import (
    AgentConnected, AgentLost, AgentUnreachable, Fact, GenerationFailed, SessionClosed, TrainingReturned, WorkerExited,
)
from ringmaster.rendezvous.control.policies import ExitMeaning, generation_policy, policy_of
from ringmaster.rendezvous.control.records import Generation, Host, JobOutcome, Phase, ResetCause, Summary, Worker
from ringmaster.settings import JobSettings
from ringmaster.rendezvous.control.worker_env import RANK_ENV_NAMES, base_env, rank_env, tentative_rank_env

#: Seconds after which a host that is neither discovered nor connected, and runs no worker, is
#: forgotten (it leaves `/status` and the store): agents that said hello and vanished do not
#: pile up.
FORGET_DEPARTED_HOST_S = 60.0

#: A gap this long between two ticks (which come every fraction of a second) means the
#: rendezvous itself did not run: stopped (SIGSTOP), swapped out, starved of CPU.
STALL_S = 1.5

#: Returns (host, port) of a fresh TCPStore for a planned generation's plain workers.
StoreFactory = Callable[[int], tuple[str, int]]


@dataclass(frozen=True)
class RingStoreAddress:
    """Where the torch.distributed TCPStore of the rings listens (not the state store)."""

    host: str
    port: int


def describe_exit(exit_code: int, signal_number: int) -> str:
    if signal_number:
        try:
            name = signal.Signals(signal_number).name
        except ValueError:
            name = f"signal {signal_number}"
        return f"was killed by signal {signal_number} ({name})"
    return f"exited with code {exit_code}"


class Coordinator:
    def __init__(
        self,
        settings: JobSettings,
        rendezvous_address: str,
        ring_store: RingStoreAddress,
        plain_store_factory: StoreFactory,
        blacklist: Blacklist | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.settings = settings
        self.rendezvous_address = rendezvous_address
        self.ring_store = ring_store
        self._plain_store_factory = plain_store_factory
        cooldown = CooldownRange(*settings.blacklist_cooldown_s) if settings.blacklist_cooldown_s else None
        self.blacklist = blacklist or Blacklist(cooldown)
        self._on_event = on_event  # the server logs them; tests read `summary.events`

        self.hosts: dict[str, Host] = {}
        self.workers: dict[str, Worker] = {}
        self.generation: Generation | None = None
        self.outcome: JobOutcome | None = None
        self.summary = Summary()
        self.finishing = False  # some worker's training function returned: no new generations
        self.target_np: int | None = None  # set by `ringmaster scale`; within [min_np, max_np]

        self._next_id = 1  # worker ids are host/N with N never reused in a job
        self._hosts_sequence = 0
        self._pending_cause: list[str] = []
        self._pending_kinds: set[ResetCause] = set()  # the same, typed
        self._fault_at: float | None = None  # when the failure not yet recovered from was seen
        self._fault_generation = 0  # the generation it broke
        self._first_discovery_at: float | None = None
        self._short_since: float | None = None
        self._sent_to_agents: dict[str, tuple] = {}
        self._generation_started = 0.0
        self.generation_formed_at = 0.0  # when the current generation formed (the last reset)
        self._quick_failures = 0  # consecutive generations that failed soon after forming, without progress
        self._steps_at_start = 0  # the job's committed steps when the current generation formed
        self.last_tick: float | None = None
        self.stall_ended_at: float | None = None  # when the rendezvous last came back from a stall
        self.isolated_since: float | None = None  # when every host fell silent at once (see _isolated)
        self._host_order: list[str] = []  # discovery's order (Horovod's): lower ranks go to older hosts
        self._exit_awaited: dict[str, float] = {}  # worker id -> when its connection closed
        self._blacklisted_for: dict[str, str] = {}  # host -> the failure that blacklisted it
        self.outbox: list[Effect] = []  # what the server delivers after each call
        self._unsettled = False  # inputs arrived that `settle` has not acted on yet
        self._snapshots = job_record.Snapshots()  # so `record` rebuilds only what changed
        self._facts: deque[Fact] = deque()  # observed by inputs, decided on by `settle`

    # ------------------------------------------------------------------ inputs: discovery
    def set_hosts(self, hosts: Mapping[str, int], now: float) -> None:
        """Discovery's latest good host set."""
        old = {h.name: h.slots for h in self.hosts.values() if h.discovered}
        change = diff_hosts(old, hosts)
        if self._first_discovery_at is None:
            self._first_discovery_at = now
            self.summary.started_at = now
            self._emit(now, Kind.HOSTS_DISCOVERED, hosts=dict(hosts))
        elif change:
            self._emit(now, Kind.HOSTS_CHANGED, description=change.describe(), added=dict(change.added),
                       removed=list(change.removed), resized={h: list(ab) for h, ab in change.resized.items()})
            self._pending_cause.append(f"discovery {change.describe()}")
            if change.added or any(new > old for old, new in change.resized.values()):
                self._pending_kinds.add(ResetCause.HOST_ADDED)
            if change.removed or any(new < old for old, new in change.resized.values()):
                self._pending_kinds.add(ResetCause.HOST_REMOVED)
        for name, slots in hosts.items():
            host = self.hosts.setdefault(name, Host(name, slots))
            host.slots, host.discovered = slots, True
        for name in change.removed:
            self.hosts[name].discovered = False
        self._host_order = [n for n in self._host_order if n in hosts] + [n for n in hosts if n not in self._host_order]
        self._unsettled = True

    def discovery_failed(self, message: str, now: float) -> None:
        self._emit(now, Kind.DISCOVERY_FAILED, error=message)

    # ------------------------------------------------------------------ inputs: agents
    def agent_connected(self, host: str, pid: int, now: float, running: list[str] | None = None) -> None:
        """An agent opened its session; `running` names the workers it runs (a reconnecting
        agent's workers that are not among them died while it was away)."""
        record = self.hosts.setdefault(host, Host(host, 0, discovered=False))
        again = record.agent_connected and record.agent_pid == pid
        record.agent_connected, record.agent_pid, record.last_heartbeat = True, pid, now
        self._sent_to_agents.pop(host, None)  # a new session needs the full picture
        self._emit(now, Kind.AGENT_RECONNECTED if again else Kind.AGENT_CONNECTED, host=host, pid=pid)
        self._observe(AgentConnected(host, frozenset(running or ())))

    def agent_launch_failed(self, host: str, reason: str, now: float) -> None:
        """The launcher could not start the agent of `host` (its ssh exited before the agent
        connected): the host counts as failed, by the blacklist's rules."""
        if host in self.hosts:
            self._observe(AgentUnreachable(host, reason))

    def agent_heartbeat(self, host: str, now: float) -> None:
        if host in self.hosts:
            self.hosts[host].last_heartbeat = now

    def agent_disconnected(self, host: str, now: float, reason: str = "closed its connection", silent: bool = False) -> None:
        """The host's agent is gone: its session closed, or (`silent`) it stopped answering
        without closing it, as a host cut off by a partition (or frozen) does."""
        record = self.hosts.get(host)
        if record is None or not record.agent_connected:
            return
        record.agent_connected = False
        self._sent_to_agents.pop(host, None)
        self._observe(AgentLost(host, reason, silent))

    def worker_exited(self, host: str, worker_id: str, exit_code: int, signal_number: int, stopped_by_agent: bool, now: float) -> None:
        """A worker process exited (its agent's report)."""
        if worker_id in self.workers:
            self._observe(WorkerExited(host, worker_id, exit_code, signal_number, stopped_by_agent))

    # ------------------------------------------------------------------ inputs: workers
    def worker_connected(self, worker_id: str, pid: int, now: float, waiting_after: int | None = None,
                         failure: str = "", elastic: bool = False) -> None:
        """A worker opened its session; `Refused` if it is unknown or gone.
        A reconnecting worker that waits for a new generation says so (`waiting_after`)."""
        worker = self.workers.get(worker_id)
        if worker is None:
            raise Refused(f"worker {worker_id!r} is not part of this job")
        if not worker.live or worker.stopping:
            raise Refused(f"worker {worker_id} is being stopped")
        worker.registered, worker.pid, worker.last_heartbeat = True, pid, now
        self._emit(now, Kind.WORKER_CONNECTED, worker=worker_id, pid=pid)
        if worker.phase is Phase.SPAWNING:
            worker.phase = Phase.MEMBER if self._is_member(worker) else Phase.WARMING
        gen = self.generation
        if worker.phase is Phase.MEMBER and gen is not None:
            if gen.over is not None:
                self.outbox.append(EndGeneration(worker_id, gen.number, gen.over))
            else:
                self._send_assignment(worker)
        placed = worker.phase is Phase.MEMBER and gen is not None and gen.over is None and gen.number > (waiting_after or 0)
        if waiting_after is not None and not placed:
            self.worker_ready(worker_id, waiting_after, failure, elastic, now)
            return
        self._unsettled = True

    def worker_disconnected(self, worker_id: str, now: float) -> None:
        """A worker's session closed."""
        if worker_id in self.workers:
            self._observe(SessionClosed(worker_id))

    def _on_session_closed(self, fact: SessionClosed, now: float) -> None:
        worker_id = fact.worker_id
        worker = self.workers.get(worker_id)
        if worker is None or not worker.live or worker.stopping or worker.done:
            return
        if not policy_of(worker).closed_connection_is_failure():
            return  # outside hvd.elastic.run an exit may be success: its agent reports the code
        # An elastic worker that did not return from its training function died. Its exit code
        # follows (a crashing interpreter takes up to a second to exit); the next ring waits for
        # it, so that a blacklisted host is left out at once: one failure, one reset (Horovod too
        # waits for every worker's status).
        self._worker_failed(worker, "its connection to the rendezvous closed", now, blame_host=False, host_lost=False)
        self._exit_awaited[worker_id] = now
        self._unsettled = True

    def worker_heartbeat(self, worker_id: str, commits: int, elastic: bool, now: float) -> None:
        worker = self.workers.get(worker_id)
        if worker is None:
            return
        worker.last_heartbeat = now
        self._note_commits(worker, commits, now)
        if elastic and not worker.elastic:
            worker.elastic = True
            self._unsettled = True

    def worker_ready(self, worker_id: str, after_generation: int, failure: str, elastic: bool, now: float) -> None:
        worker = self.workers.get(worker_id)
        if worker is None:
            raise Refused(f"worker {worker_id!r} is not part of this job")
        if not worker.live:
            raise Refused(f"worker {worker_id} was already counted as failed ({worker.failed})")
        if worker.stopping:
            raise Refused(f"worker {worker_id} is leaving the job")
        worker.elastic = worker.elastic or elastic
        self._emit(now, Kind.WORKER_READY, worker=worker_id, after_generation=after_generation, failure=failure)
        if failure:
            self._observe(GenerationFailed(worker_id, after_generation, failure))
        if worker.phase is not Phase.EXITED:
            worker.phase = Phase.READY
            worker.ready_at = now
        worker.last_heartbeat = now
        self._unsettled = True

    def worker_done(self, worker_id: str, commits: int, now: float, warning: str = "") -> None:
        """The worker's training function returned; `warning` is what the job's end must say."""
        worker = self.workers.get(worker_id)
        if worker is None or worker.done:
            return
        self._note_commits(worker, commits, now)
        worker.done = True
        self._emit(now, Kind.WORKER_RETURNED, worker=worker_id)
        if warning:
            self._emit(now, Kind.WORKER_WARNING, worker=worker_id, warning=warning)
            self.summary.warnings.append(f"worker {worker_id}: {warning}")
        self._observe(TrainingReturned(worker_id))

    def scale(self, np: int, now: float) -> None:
        """Ask for a world size of `np` workers (as slots allow); `Refused`, saying why, when it cannot be."""
        if self.outcome is not None:
            raise Refused("the job has already ended")
        if np < self.settings.min_np:
            raise Refused(f"cannot scale to {np} workers: --min-np is {self.settings.min_np}")
        if self.settings.max_np is not None and np > self.settings.max_np:
            raise Refused(f"cannot scale to {np} workers: --max-np is {self.settings.max_np}")
        self.target_np = np
        self._emit(now, Kind.SCALE_REQUESTED, np=np)
        self._pending_cause.append(f"scaled to {np}")
        self._pending_kinds.add(ResetCause.SCALE)
        self._unsettled = True

    @property
    def limit(self) -> int | None:
        """The most workers the job may have now: --max-np, or the scale target if lower."""
        caps = [c for c in (self.settings.max_np, self.target_np) if c is not None]
        return min(caps) if caps else None

    def abort(self, reason: str, now: float) -> None:
        """End the job as failed (the user interrupted it)."""
        self._fail(reason, now)

    # ------------------------------------------------------------------ the store
    def record(self) -> dict[str, dict]:
        """The job as the store keeps it (keys relative to the job's prefix)."""
        job = job_record.JobRecord(
            format=job_record.FORMAT, version=job_record.VERSION, next_id=self._next_id,
            hosts_sequence=self._hosts_sequence, target_np=self.target_np, finishing=self.finishing,
            generations=self.summary.generations, resets=self.summary.resets, steps=self.summary.steps,
            outcome=(self.outcome.success, self.outcome.message) if self.outcome else None,
        )
        return job_record.job_values(job, self.hosts, self.workers, self.generation, self._snapshots)

    def resume(self, restored: job_record.Restored, now: float, agents_survive: bool = True) -> None:
        """Carry on the job a previous rendezvous process kept in the store.

        Hosts and workers get a fresh heartbeat window to reconnect (their last heartbeats were
        on the old process's clock). Without `agents_survive` (`ringmaster run`, whose emulated
        hosts died with it) every worker is gone, so the job restarts from its checkpoint.
        """
        job = restored.job
        self.hosts, self.workers, self.generation = restored.hosts, restored.workers, restored.generation
        self._next_id, self._hosts_sequence = job.next_id, job.hosts_sequence
        self.target_np, self.finishing = job.target_np, job.finishing
        self.summary.generations, self.summary.resets, self.summary.steps = job.generations, job.resets, job.steps
        self.summary.started_at = now
        self._first_discovery_at = now
        self._generation_started = now - self.settings.crash_loop_window_s  # not a quick failure
        for host in self.hosts.values():
            host.agent_connected = host.agent_connected and agents_survive
            host.last_heartbeat = now
        store = f"{self.ring_store.host}:{self.ring_store.port}"
        for worker in self.workers.values():
            worker.last_heartbeat = worker.ready_at = now
            # The store is data: a worker's environment is this job's own (its settings, this
            # rendezvous and ring store), with only its place in the ring taken from the record.
            place = {name: value for name, value in worker.env.items() if name in RANK_ENV_NAMES}
            worker.env = {**base_env(worker.worker_id, worker.host, worker.slot, self.rendezvous_address, store,
                                     self.settings), **place}
            if not agents_survive and worker.live:
                worker.phase = Phase.EXITED
        number = self.generation.number if self.generation else 0
        live = sum(1 for w in self.workers.values() if w.live)
        self._emit(now, Kind.JOB_RESUMED, number=number, live=live,
                   hosts=sum(1 for h in self.hosts.values() if h.agent_connected))
        if not agents_survive and self.generation is not None:
            self._pending_cause.append("the previous rendezvous and its hosts ended")
            self._pending_kinds.add(ResetCause.RESTART)
            self._end_generation("the previous `ringmaster run` ended with its workers", now)
        if job.outcome is not None:
            self._end_job(JobOutcome(*job.outcome), now)
            return
        self._unsettled = True

    # ------------------------------------------------------------------ deciding on facts
    def _observe(self, fact: Fact) -> None:
        self._facts.append(fact)
        self._unsettled = True

    def _decide(self, now: float) -> None:
        """Decide on the facts the inputs observed, in the order they came."""
        while self._facts:
            fact = self._facts.popleft()
            if isinstance(fact, AgentConnected):
                self._on_agent_connected(fact, now)
            elif isinstance(fact, AgentLost):
                self._on_agent_lost(fact, now)
            elif isinstance(fact, AgentUnreachable):
                if not self.hosts.get(fact.host, Host(fact.host, 0)).agent_connected:
                    self._emit(now, Kind.HOST_UNREACHABLE, host=fact.host, reason=fact.reason)
                    self._blacklist_host(fact.host, f"its agent could not be started: {fact.reason}", now, by_itself=True)
            elif isinstance(fact, WorkerExited):
                self._on_worker_exited(fact, now)
            elif isinstance(fact, SessionClosed):
                self._on_session_closed(fact, now)
            elif isinstance(fact, GenerationFailed):
                gen = self.generation
                if gen is not None and gen.number == fact.generation and gen.over is None:
                    self._end_generation(f"worker {fact.worker_id} reported: {fact.failure}", now)
            elif isinstance(fact, TrainingReturned):
                self._start_finishing(now)

    def _on_agent_connected(self, fact: AgentConnected, now: float) -> None:
        """A (re)connected agent's workers that it does not run died while it was away."""
        host = fact.host
        for worker in self._workers_on(host):
            if worker.live and worker.phase is not Phase.SPAWNING and worker.worker_id not in fact.running:
                worker.phase = Phase.EXITED
                if self._is_member(worker) and not worker.done:
                    self._end_generation(f"member {worker.worker_id} is gone: the agent of {host} does not run it", now)
                if not worker.done:
                    self._worker_failed(worker, f"its process is gone: the agent of {host} does not run it", now,
                                        blame_host=False, host_lost=False)

    def _on_agent_lost(self, fact: AgentLost, now: float) -> None:
        """A host that left the job said goodbye; any other lost agent is a lost host."""
        host, reason = fact.host, fact.reason
        record = self.hosts.get(host)
        # If its session is still open (a missed heartbeat), tell it to stop its workers.
        self.outbox.append(StopAgent(host, f"host {host} counted as lost: {reason}"))
        if self.outcome is not None or record is None:
            return
        if not record.discovered and not any(w.live for w in self._workers_on(host)):
            self._emit(now, Kind.HOST_LEFT, host=host)
            return
        self._emit(now, Kind.HOST_LOST, host=host, reason=reason)
        self._pending_cause.append(f"host {host} lost")
        self._pending_kinds.add(ResetCause.PARTITION if fact.silent else ResetCause.HOST_LOST)
        for worker in self._workers_on(host):
            if worker.live and not worker.stopping and not worker.done:
                self._worker_failed(worker, f"its host {host} was lost", now, blame_host=False, host_lost=True)
            worker.phase = Phase.EXITED
        self._blacklist_host(host, f"its agent {reason}", now, by_itself=False)

    def _on_worker_exited(self, fact: WorkerExited, now: float) -> None:
        """What the exit means (the job's policy), then what follows from it."""
        host, worker_id, exit_code, signal_number = fact.host, fact.worker_id, fact.exit_code, fact.signal
        stopped_by_agent = fact.stopped_by_agent
        worker = self.workers.get(worker_id)
        if worker is None or worker.phase is Phase.EXITED:
            return
        how = describe_exit(exit_code, signal_number)
        was_live, member = worker.live, self._is_member(worker)
        worker.phase = Phase.EXITED
        verdict = policy_of(worker).exit_verdict(worker, exit_code, signal_number, stopped_by_agent, was_live, member)
        if member and verdict.meaning is not ExitMeaning.FINISHED:
            # Whatever the reason (even a stop we asked for), the ring cannot complete without it.
            self._end_generation(f"member {worker_id} on {host} {how}", now)
        exit_fields = {"worker": worker_id, "host": host, "how": how, "exit_code": exit_code, "signal": signal_number}
        if verdict.meaning is ExitMeaning.STOPPED:
            self._emit(now, Kind.WORKER_STOPPED, **exit_fields)
        elif verdict.meaning is ExitMeaning.FINISHED:
            worker.done = True
            self._emit(now, Kind.WORKER_FINISHED, **exit_fields)
            self._start_finishing(now)
        else:
            self._emit(now, Kind.WORKER_EXITED, **exit_fields)
            if was_live:
                self._worker_failed(worker, how, now, blame_host=False, host_lost=False)
            if verdict.blacklist:
                self._blacklist_host(host, f"worker {worker_id} {how}", now, by_itself=verdict.by_itself)

    # ------------------------------------------------------------------ acting
    def settle(self, now: float) -> bool:
        """Act on the inputs recorded since the last `settle` or `tick`. False: there were none."""
        if not self._unsettled:
            return False
        self._reconcile(now)
        return True

    def tick(self, now: float) -> None:
        """Called every few hundred milliseconds: timeouts that no message announces."""
        if self.outcome is not None:
            return
        if self.last_tick is not None and now - self.last_tick > STALL_S:
            self._after_stall(now, now - self.last_tick)
        self.last_tick = now
        timeout = self.settings.heartbeat_timeout_s
        isolated = self._isolated(now)  # then nobody is judged by silence: the rendezvous may be the one cut off
        for host in self.hosts.values():
            if not isolated and host.agent_connected and now - host.last_heartbeat > timeout:
                self.agent_disconnected(host.name, now, f"sent no heartbeat for {now - host.last_heartbeat:.1f} s",
                                        silent=True)
        self._decide(now)  # a lost host before its workers' own silence: the host is the cause
        self._forget_departed_hosts(now)
        for worker in [] if isolated else list(self.workers.values()):
            if worker.registered and worker.live and not worker.stopping and now - worker.last_heartbeat > timeout:
                self._worker_failed(
                    worker, f"sent no heartbeat for {now - worker.last_heartbeat:.1f} s (hung or stopped)", now,
                    blame_host=True, host_lost=False,
                )
        self._reconcile(now)

    def _isolated(self, now: float) -> bool:
        """Every connected host (two or more) fell silent at once: more likely this rendezvous is
        cut off than all of them died, and training needs no rendezvous. Nobody is judged by
        silence then (hosts nor workers); once the first host is past the timeout the rendezvous
        says it waits, up to `reconnect_timeout_s` (the agents fence themselves after that long
        without us), then judges as usual. When anyone is heard again, everyone gets a fresh
        window, so hosts whose heartbeats come back a moment later are not counted lost."""
        if self.all_silent(now):
            connected = [h for h in self.hosts.values() if h.agent_connected]
            if self.isolated_since is None:
                if not any(now - h.last_heartbeat > self.settings.heartbeat_timeout_s for h in connected):
                    return True  # silent together, not yet for long: judge nobody
                self.isolated_since = max(h.last_heartbeat for h in connected)
                self._emit(now, Kind.RENDEZVOUS_ISOLATED, hosts=len(connected), seconds=now - self.isolated_since,
                           wait_s=self.settings.reconnect_timeout_s)
            return now - self.isolated_since < self.settings.reconnect_timeout_s
        if self.isolated_since is not None:
            self._emit(now, Kind.RENDEZVOUS_REJOINED, seconds=now - self.isolated_since)
            self.isolated_since = None
            for host in self.hosts.values():
                host.last_heartbeat = max(host.last_heartbeat, now)
            for worker in self.workers.values():
                worker.last_heartbeat = max(worker.last_heartbeat, now)
        return False

    def _lately(self) -> float:
        """Hosts beat every interval, so a partition silences them within about one interval of
        each other: "at once" means none was heard for this long."""
        return min(2 * self.settings.heartbeat_interval_s, self.settings.heartbeat_timeout_s / 2)

    def all_silent(self, now: float) -> bool:
        """Two or more hosts connected, and none heard lately (see `_isolated`)."""
        connected = [h for h in self.hosts.values() if h.agent_connected]
        return len(connected) >= 2 and now - max(h.last_heartbeat for h in connected) > self._lately()

    def waiting_out_isolation(self, now: float) -> bool:
        """Is the rendezvous waiting, or about to wait, for hosts that all fell silent at once
        (see `_isolated`)? A store lease that runs out meanwhile says nothing of its agent."""
        if self.isolated_since is not None:
            return now - self.isolated_since < self.settings.reconnect_timeout_s
        return self.all_silent(now)

    def stalled_recently(self, now: float, window_s: float) -> bool:
        """Is the rendezvous stalled right now (no tick for STALL_S), or did it come back from a
        stall less than `window_s` ago? Then a lease that ran out says nothing of its agent."""
        if self.last_tick is not None and now - self.last_tick > STALL_S:
            return True
        return self.stall_ended_at is not None and now - self.stall_ended_at < window_s

    def _after_stall(self, now: float, gap: float) -> None:
        """The rendezvous did not run for `gap` seconds: it was deaf, the others were not dead.
        Liveness is judged from the heartbeats received from now on: everyone gets a fresh
        window (what arrived while it was stopped is being read now)."""
        self.stall_ended_at = now
        self._emit(now, Kind.RENDEZVOUS_STALLED, seconds=gap)
        for host in self.hosts.values():
            host.last_heartbeat = max(host.last_heartbeat, now)
        for worker in self.workers.values():
            worker.last_heartbeat = max(worker.last_heartbeat, now)
        for worker_id in self._exit_awaited:
            self._exit_awaited[worker_id] = max(self._exit_awaited[worker_id], now)

    def _forget_departed_hosts(self, now: float) -> None:
        busy = {w.host for w in self.workers.values() if w.live}
        for name, host in list(self.hosts.items()):
            if (not host.discovered and not host.agent_connected and name not in busy
                    and now - host.last_heartbeat > FORGET_DEPARTED_HOST_S):
                del self.hosts[name]
                self._sent_to_agents.pop(name, None)
                self._unsettled = True

    # ------------------------------------------------------------------ state queries
    def live_workers(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.live]

    def ordered_hosts(self) -> list[Host]:
        """Discovered hosts in discovery's order: hosts known longer first, new ones in the order
        listed (Horovod's rule), so rank 0 follows `-H` and a host that joins takes the last ranks."""
        order = self._host_order or [h.name for h in self.hosts.values()]
        return [self.hosts[n] for n in order if n in self.hosts and self.hosts[n].discovered]

    def eligible_hosts(self, now: float) -> list[Host]:
        """Hosts the job may use now: discovered, agent connected, not blacklisted (in order)."""
        return [h for h in self.ordered_hosts() if h.agent_connected and not self.blacklist.is_blacklisted(h.name, now)]

    def hosts_wanted(self, now: float) -> list[str]:
        """The hosts the job can use now, in order: usable ones until their slots reach the
        job's limit (--max-np or the scale target; all without one), plus any running workers.
        Only these need an agent: 20 discovered hosts and --max-np 2 start one or two agents."""
        busy = {w.host for w in self.workers.values() if w.live}
        wanted, slots, limit = [], 0, self.limit
        for host in self.ordered_hosts():
            if self.blacklist.is_blacklisted(host.name, now):
                continue
            if limit is not None and slots >= limit and host.name not in busy:
                continue
            wanted.append(host.name)
            slots += host.slots
        return wanted

    def awaiting_exits(self, now: float) -> set[str]:
        """Hosts of failed workers whose exit status has not come yet (bounded by
        `exit_report_timeout_s`): the next ring waits for it to know whether the host is blacklisted."""
        hosts = set()
        for worker_id, since in list(self._exit_awaited.items()):
            worker = self.workers.get(worker_id)
            host = self.hosts.get(worker.host) if worker else None
            if worker is None or host is None or not host.agent_connected or worker.phase is Phase.EXITED \
                    or now - since >= self.settings.exit_report_timeout_s:
                del self._exit_awaited[worker_id]
            else:
                hosts.add(worker.host)
        return hosts

    def capacity(self, now: float) -> int:
        slots = sum(h.slots for h in self.eligible_hosts(now))
        return min(slots, self.limit) if self.limit is not None else slots

    def drain(self) -> list[Effect]:
        out, self.outbox = self.outbox, []
        return out

    # ------------------------------------------------------------------ internals
    def _emit(self, now: float, kind: Kind, **fields: object) -> Event:
        """Record one event of the job (the status API keeps the newest) and hand it on."""
        event = Event(kind, fields, self.generation.number if self.generation else 0, now)
        if event.level > logging.DEBUG:
            self.summary.add_event(event)
        if self._on_event is not None:
            self._on_event(event)
        return event

    def _note_lost_commits(self, now: float) -> None:
        """No worker that holds the job's last commit is left. With --checkpoint-dir the next
        ring resumes from the newest checkpoint; without, the committed steps are gone: say so."""
        if self.summary.steps and not self.settings.checkpoint_dir:
            self.summary.warnings.append(self._emit(now, Kind.COMMITS_LOST, steps=self.summary.steps).message)
            self.summary.steps_lost += self.summary.steps
            self.summary.steps = 0

    def _workers_on(self, host: str) -> list[Worker]:
        return [w for w in self.workers.values() if w.host == host]

    def _is_member(self, worker: Worker) -> bool:
        gen = self.generation
        return gen is not None and worker.worker_id in gen.member_set

    def _note_commits(self, worker: Worker, commits: int, now: float) -> None:
        """Commits are counted by the state (they go back on a rollback); rank 0's count is the job's.
        Rank 0's first commit in a generation formed after a failure ends the recovery from it."""
        worker.commits = commits
        gen = self.generation
        if gen is not None and gen.members and gen.members[0].worker_id == worker.worker_id:
            self.summary.steps = commits
            if self._fault_at is not None and gen.number > self._fault_generation and commits > self._steps_at_start:
                self._emit(now, Kind.JOB_RECOVERED, seconds=now - self._fault_at, number=gen.number)
                self._fault_at = None

    def _blacklist_host(self, host: str, why: str, now: float, by_itself: bool) -> None:
        """Horovod's rule: the host of a failed worker is blacklisted. An elastic worker that
        exited by itself with an error is the script's doing, blacklisted whatever is left. A worker killed
        by a signal (OOM killer, preemption, kill -9) or a lost host is spared when the job
        would otherwise fall below --min-np (`--spare-last-hosts`, the default): the job then
        restarts there from its last commit or checkpoint instead of failing."""
        if self.blacklist.is_blacklisted(host, now) or self.finishing:
            return
        record = self.hosts.get(host)
        others = sum(h.slots for h in self.eligible_hosts(now) if h.name != host)
        if (not by_itself and self.settings.spare_last_hosts and record is not None and record.discovered
                and others < self.settings.min_np):
            self._emit(now, Kind.HOST_SPARED, host=host, min_np=self.settings.min_np)
            return
        cooldown = self.blacklist.record_failure(host, now)
        self._blacklisted_for[host] = why
        self._emit(now, Kind.HOST_BLACKLISTED, host=host, cooldown_s=None if math.isinf(cooldown) else cooldown, why=why)
        discovered = [h for h in self.hosts.values() if h.discovered]
        if discovered and all(self.blacklist.is_blacklisted(h.name, now) for h in discovered):
            reasons = "; ".join(f"{h.name}: {self._blacklisted_for.get(h.name, 'failed')}" for h in discovered)
            self._fail(
                f"every host is blacklisted after failures ({reasons}): one or more processes exited with "
                "non-zero status; fix the error the workers print above",
                now,
            )

    def _worker_failed(self, worker: Worker, reason: str, now: float, blame_host: bool, host_lost: bool) -> None:
        if worker.failed is not None:
            return
        worker.failed = reason
        self._emit(now, Kind.WORKER_FAILED, worker=worker.worker_id, host=worker.host, reason=reason)
        if self._fault_at is None and not worker.stopping:
            self._fault_at = now
            self._fault_generation = self.generation.number if self.generation is not None else 0
        if not host_lost:  # a lost host is its own cause
            self._pending_cause.append(f"worker {worker.worker_id} on {worker.host} failed ({reason})")
            self._pending_kinds.add(ResetCause.FAILURE)
        if self._is_member(worker):
            self._end_generation(f"worker {worker.worker_id} on {worker.host} failed: {reason}", now)
        if blame_host:
            self._blacklist_host(worker.host, f"worker {worker.worker_id} {reason}", now, by_itself=False)

    def _end_generation(self, reason: str, now: float) -> None:
        gen = self.generation
        if gen is None or gen.over is not None:
            return
        gen.over = reason
        if not self._pending_cause:
            self._pending_cause.append(reason)
        if not self._pending_kinds:
            self._pending_kinds.add(ResetCause.OTHER)
        self._emit(now, Kind.GENERATION_OVER, number=gen.number, reason=reason)
        # A generation that committed steps trained: however short it was, it is no crash loop.
        progressed = self.summary.steps > self._steps_at_start
        if now - self._generation_started < self.settings.crash_loop_window_s and not progressed:
            self._quick_failures += 1
        else:
            self._quick_failures = 0
        if self._quick_failures >= self.settings.crash_loop_limit:
            self._fail(
                f"{self._quick_failures} generations in a row failed within {self.settings.crash_loop_window_s:g} s "
                f"of forming without committing a step; the last: {reason}. Fix the error the workers print above",
                now,
            )
            return
        for worker_id in gen.member_ids:
            worker = self.workers[worker_id]
            if not worker.live:
                continue
            if policy_of(worker).rejoins(worker):
                self.outbox.append(EndGeneration(worker_id, gen.number, reason))
            else:
                # A plain script cannot rejoin: restart it with the rest, as torchrun does.
                worker.stopping = True
                worker.stop_requested_at = now - self.settings.stop_grace_s

    def _start_finishing(self, now: float) -> None:
        if not self.finishing:
            self.finishing = True
            self._emit(now, Kind.JOB_FINISHING)

    def _send_assignment(self, worker: Worker) -> None:
        gen = self.generation
        assert gen is not None
        a = next(m for m in gen.members if m.worker_id == worker.worker_id)
        self.outbox.append(Assign(a, gen.number, store_host=self.ring_store.host, store_port=self.ring_store.port,
                                  store_prefix=gen.store_prefix, hosts_sequence=gen.hosts_baseline))

    def _retire(self, worker: Worker, reason: str, now: float) -> None:
        if worker.stopping:
            return
        worker.stopping = True
        worker.stop_requested_at = now
        self._emit(now, Kind.WORKER_RETIRING, worker=worker.worker_id, host=worker.host, reason=reason)
        if worker.registered:
            self.outbox.append(Retire(worker.worker_id, reason))

    def _new_generation(self, members: list[RankAssignment], now: float) -> Generation:
        number = (self.generation.number if self.generation else 0) + 1
        cause = "; ".join(dict.fromkeys(self._pending_cause)) or "job start"
        self._pending_cause = []
        causes = (sorted(kind.value for kind in self._pending_kinds) or [ResetCause.OTHER.value]) if self.generation is not None else []
        self._pending_kinds = set()
        gen = Generation(number, members, cause, store_prefix=f"ringmaster/gen{number}/", hosts_baseline=self._hosts_sequence)
        if self.generation is not None:
            self.summary.resets += 1
        if now - self._generation_started >= self.settings.crash_loop_window_s:
            self._quick_failures = 0  # the last generation lived: no crash loop
        self.summary.generations += 1
        self.generation = gen
        self._generation_started = now
        self.generation_formed_at = now
        self._steps_at_start = self.summary.steps
        hosts: dict[str, int] = {}
        for a in members:
            hosts[a.host] = hosts.get(a.host, 0) + 1
        self._emit(now, Kind.GENERATION_FORMED, number=number, size=len(members), hosts=hosts, cause=cause,
                   causes=causes)
        return gen

    def _exceeds_reset_limit(self, now: float) -> bool:
        limit = self.settings.reset_limit
        if limit is not None and self.summary.resets >= limit:
            self._fail(
                f"reset {self.summary.resets + 1} is needed but --reset-limit is {limit}; "
                "raise --reset-limit or fix what keeps failing (see the events above)",
                now,
            )
            return True
        return False

    def _fail(self, message: str, now: float) -> None:
        self._end_job(JobOutcome(False, message), now)

    def _end_job(self, outcome: JobOutcome, now: float) -> None:
        if self.outcome is not None:
            return
        self.outcome = outcome
        self.summary.ended_at = now
        self._emit(now, Kind.JOB_SUCCEEDED if outcome.success else Kind.JOB_FAILED, reason=outcome.message)
        for worker in self.live_workers():
            if worker.registered:
                self.outbox.append(EndJob(worker.worker_id, outcome.success, outcome.message))
        for host in self.hosts.values():
            if host.agent_connected:
                self.outbox.append(StopAgent(host.name, outcome.message))

    # ------------------------------------------------------------------ reconcile
    def _reconcile(self, now: float) -> None:
        """Bring the job one step closer to what the current facts call for."""
        if self._first_discovery_at is None:
            # Neither discovered nor resumed yet (an agent's hello can come first): deciding now
            # would tell that agent to run nothing and stop the workers a resumed job still has.
            return
        self._unsettled = False
        self._decide(now)
        if self.outcome is not None:
            return
        eligible = {h.name for h in self.eligible_hosts(now)}
        self._retire_outcasts(eligible, now)
        if self.finishing:
            for worker in self.live_workers():
                # A newcomer still starting up can never join now: it is not waited for.
                if not worker.done and (worker.phase is Phase.READY or not self._is_member(worker)):
                    self._retire(worker, "the job finished while this worker waited for a new ring", now)
            if not self.live_workers():
                done = sum(1 for w in self.workers.values() if w.done)
                self._end_job(JobOutcome(True, f"{done} worker(s) finished training"), now)
                return
        else:
            self._check_min_np(now)
            if self.outcome is not None:
                return
            if self.generation is None:
                self._maybe_plan_first(now)
            elif self._generation_finished():
                self._next_generation(now)
            else:
                self._maybe_request_update(eligible, now)
            self._spawn_newcomers(eligible, now)
        self._publish_agents(now)

    def _retire_outcasts(self, eligible: set[str], now: float) -> None:
        gen = self.generation
        for worker in self.live_workers():
            if worker.host in eligible or worker.stopping:
                continue
            reason = f"host {worker.host} left the job"
            if self._is_member(worker) and gen is not None and gen.over is None:
                policy = policy_of(worker)
                if policy.leaves_at_commit(worker):
                    continue  # leaves at its next commit, through a host update
                if not policy.rejoins(worker):
                    self._end_generation(reason, now)  # plain job: restart without the host
            self._retire(worker, reason, now)

    def _check_min_np(self, now: float) -> None:
        if self._first_discovery_at is None:
            return
        if self.generation is None and now - self._first_discovery_at < self.settings.start_timeout_s:
            return  # agents are still connecting
        capacity = self.capacity(now)
        if capacity >= self.settings.min_np:
            self._short_since = None
            return
        if self._short_since is None:
            self._short_since = now
            self._emit(now, Kind.SLOTS_SHORT, capacity=capacity, min_np=self.settings.min_np,
                       timeout_s=self.settings.elastic_timeout_s)
        elif now - self._short_since >= self.settings.elastic_timeout_s:
            self._fail(
                f"the job needs at least {self.settings.min_np} workers (--min-np) but had only {capacity} "
                f"for {self.settings.elastic_timeout_s:g} s (--elastic-timeout); add hosts or lower --min-np",
                now,
            )

    def _maybe_plan_first(self, now: float) -> None:
        """Plan the first generation once the hosts that get its ranks are connected: the first
        hosts in discovery order up to --max-np (all of them without a limit), so rank 0 is on
        the first host listed; after --start-timeout, with whoever is there."""
        if self._first_discovery_at is None:
            return
        ready = all(self.hosts[name].agent_connected for name in self.hosts_wanted(now))
        waited = now - self._first_discovery_at >= self.settings.start_timeout_s
        if self.capacity(now) >= self.settings.min_np and (ready or waited):
            self._plan_generation(now)

    def _generation_finished(self) -> bool:
        """True when no live member of the current generation is still training in it (members
        that are leaving do not hold up the next ring)."""
        gen = self.generation
        assert gen is not None
        members = [self.workers[i] for i in gen.member_ids]
        if gen.over is None and gen.update_sequence == 0:
            return all(not w.live for w in members)
        return all(not w.live or w.stopping or w.phase is Phase.READY for w in members)

    def _next_generation(self, now: float) -> None:
        gen = self.generation
        assert gen is not None
        if self.awaiting_exits(now):
            return  # a failed worker's status decides whether its host stays: wait for it
        eligible = {h.name for h in self.eligible_hosts(now)}
        survivors = [self.workers[i] for i in gen.member_ids]
        survivors = [w for w in survivors if self._candidate(w, eligible)]
        kept = {w.worker_id for w in survivors}  # by id: comparing the records field by field is quadratic
        newcomers = [w for w in self.workers.values() if w.worker_id not in kept and self._candidate(w, eligible)]
        if not survivors and not newcomers:
            if not any(w.live for w in self.workers.values()):
                self._note_lost_commits(now)
                self._plan_generation(now)  # nothing can rejoin in place: restart everything
            return
        if len(survivors) + len(newcomers) < self.settings.min_np:
            return  # wait for newcomers to warm up, or for --elastic-timeout
        if self._exceeds_reset_limit(now):
            return
        if not survivors:
            self._note_lost_commits(now)  # newcomers alone: nobody holds the last commit
        slots = [WorkerSlot(w.worker_id, w.host) for w in (*survivors, *newcomers)]
        members = assign_ranks(slots[: len(survivors)], slots[len(survivors):], self.limit)
        new = self._new_generation(members, now)
        for a in members:
            worker = self.workers[a.worker_id]
            worker.phase, worker.generation = Phase.MEMBER, new.number
            self._send_assignment(worker)
        for worker in (*survivors, *newcomers):
            if worker.worker_id not in new.member_set:
                self._retire(worker, f"the job is limited to {self.limit} workers", now)

    @staticmethod
    def _candidate(worker: Worker, eligible: set[str]) -> bool:
        """Can join the next generation: alive, waiting for it, not leaving, on a usable host."""
        return worker.live and worker.phase is Phase.READY and not worker.stopping and worker.host in eligible

    def _plan_generation(self, now: float) -> None:
        """Spawn a whole generation with ranks in the workers' environment."""
        if self.generation is not None and self._exceeds_reset_limit(now):
            return
        slots: list[WorkerSlot] = []
        pending: list[Worker] = []
        limit = self.limit
        for host in self.eligible_hosts(now):
            for slot in range(host.slots):
                if limit is not None and len(slots) >= limit:
                    break
                worker = self._make_worker(host.name, slot)
                slots.append(WorkerSlot(worker.worker_id, host.name))
                pending.append(worker)
        if len(slots) < self.settings.min_np:
            return
        members = assign_ranks([], slots, limit)
        gen = self._new_generation(members, now)
        plain_host, plain_port = self._plain_store_factory(gen.number)
        for worker, a in zip(pending, members):
            worker.generation = gen.number
            worker.env.update(rank_env(a, gen.number, plain_host, plain_port))
            self.workers[worker.worker_id] = worker

    def _make_worker(self, host: str, slot: int) -> Worker:
        worker_id = f"{host}/{self._next_id}"
        self._next_id += 1
        store = f"{self.ring_store.host}:{self.ring_store.port}"
        return Worker(worker_id, host, slot, base_env(worker_id, host, slot, self.rendezvous_address, store, self.settings))

    def _maybe_request_update(self, eligible: set[str], now: float) -> None:
        """Elastic job, healthy generation: interrupt it at the next commit if the ring should change."""
        gen = self.generation
        assert gen is not None
        if gen.over is not None or gen.update_sequence:
            return
        members = [self.workers[i] for i in gen.member_ids]
        policy = generation_policy(members)
        if not policy.grows_in_place():
            if not any(policy.rejoins(w) for w in members):
                self._maybe_restart_plain(members, now)
            return
        if not all(w.elastic for w in members if w.live):
            return  # still starting up: not every member is inside hvd.elastic.run yet
        reasons = []
        ready_newcomers = [w for w in self.workers.values() if self._candidate(w, eligible) and not self._is_member(w)]
        limit = self.limit if self.limit is not None else 1 << 30
        room = limit - len(members)
        warming = [
            w for w in self.workers.values()
            if w.live and not w.stopping and w.phase in (Phase.SPAWNING, Phase.WARMING) and w.host in eligible
        ]
        if ready_newcomers and warming and now - min(w.ready_at for w in ready_newcomers) < self.settings.warmup_grace_s:
            ready_newcomers = []  # let the others finish warming up and join in the same reset
        kinds = set()
        if ready_newcomers and room > 0:
            reasons.append("new worker(s) ready: " + ", ".join(w.worker_id for w in ready_newcomers[:room]))
            kinds.add(ResetCause.HOST_ADDED)
        leaving = [w for w in members if w.live and w.host not in eligible]
        if leaving:
            reasons.append("host(s) leaving: " + ", ".join(sorted({w.host for w in leaving})))
            kinds.add(ResetCause.HOST_REMOVED)
        if sum(1 for w in members if w.live) > limit:
            reasons.append(f"scaling down to {limit} workers")
            kinds.add(ResetCause.SCALE)
        if not reasons:
            return
        self._hosts_sequence += 1
        gen.update_sequence = self._hosts_sequence
        reason = "; ".join(reasons)
        self._pending_cause.append(reason)
        if not self._pending_kinds:  # (discovery or a scale request said it first where they caused it)
            self._pending_kinds |= kinds
        self._emit(now, Kind.HOSTS_UPDATED, reason=reason)
        for w in members:
            if w.live and w.registered:
                self.outbox.append(UpdateHosts(w.worker_id, gen.update_sequence, reason))

    def _maybe_restart_plain(self, members: list[Worker], now: float) -> None:
        """A plain job grows only by restarting, as torchrun does on a membership change."""
        size = sum(1 for w in members if w.live)
        if self.capacity(now) > size:
            self._pending_cause.append(f"capacity grew to {self.capacity(now)}")
            self._pending_kinds.add(ResetCause.HOST_ADDED)
            self._end_generation(f"more slots available ({self.capacity(now)} > {size}); restarting all workers", now)
        elif self.limit is not None and size > self.limit:
            self._end_generation(f"scaled down to {self.limit} workers; restarting all workers", now)

    def _spawn_newcomers(self, eligible: set[str], now: float) -> None:
        """Elastic job: start workers on free slots; they join once warmed up."""
        gen = self.generation
        if gen is None or not generation_policy([self.workers[i] for i in gen.member_ids]).grows_in_place():
            return
        live = [w for w in self.live_workers() if not w.stopping]
        room = (self.limit if self.limit is not None else 1 << 30) - len(live)
        started: list[Worker] = []
        used_slots: dict[str, set[int]] = {}
        for w in live:
            used_slots.setdefault(w.host, set()).add(w.slot)
        undecided = self.awaiting_exits(now)  # may be blacklisted in a moment: do not refill yet
        for host in self.eligible_hosts(now):
            if host.name in undecided:
                continue
            used = used_slots.get(host.name, set())
            for slot in range(host.slots):
                if len(started) >= room:
                    break
                if slot in used:
                    continue
                worker = self._make_worker(host.name, slot)
                self.workers[worker.worker_id] = worker
                self._emit(now, Kind.WORKER_STARTING, worker=worker.worker_id, host=host.name)
                started.append(worker)
        if started:
            gen_order = {wid: i for i, wid in enumerate(gen.member_ids)}
            staying = sorted(live, key=lambda w: gen_order.get(w.worker_id, len(gen_order)))
            expected = assign_ranks([WorkerSlot(w.worker_id, w.host) for w in staying],
                                    [WorkerSlot(w.worker_id, w.host) for w in started])
            for worker, a in zip(started, expected[len(staying):]):
                worker.env.update(tentative_rank_env(a))

    def _publish_agents(self, now: float) -> None:
        """Tell each agent which workers to run. A retiring worker that can hear the rendezvous
        gets `stop_grace_s` to leave by itself before its agent sends SIGTERM; a crashed one
        whose exit status is awaited is left to exit by itself (for `exit_report_timeout_s`)."""
        by_host: dict[str, list[Worker]] = {}
        self.awaiting_exits(now)  # drops those waited for long enough
        awaited = self._exit_awaited  # crashed, still exiting: its agent must not stop it and hide its status
        for w in self.workers.values():
            if (w.live and (not w.stopping or (w.registered and now - w.stop_requested_at < self.settings.stop_grace_s))) \
                    or (w.worker_id in awaited and w.phase is not Phase.EXITED):
                by_host.setdefault(w.host, []).append(w)
        for host in self.hosts.values():
            if not host.agent_connected:
                continue
            specs = by_host.get(host.name, [])
            key = tuple(sorted(w.worker_id for w in specs))
            if self._sent_to_agents.get(host.name) == key:
                continue
            self._sent_to_agents[host.name] = key
            argv = tuple(self.settings.command)
            self.outbox.append(RunWorkers(host.name, tuple(WorkerLaunch(w.worker_id, w.slot, argv, dict(w.env)) for w in specs)))

