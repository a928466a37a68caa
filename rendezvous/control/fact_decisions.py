"""The rendezvous' decisions on what its inputs observed (`facts`), one rule per kind of fact,
looked up in a table (a fact of a kind with no rule is a programming error: KeyError)."""

from __future__ import annotations

from typing import Callable

from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.drains import Drains
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
from ringmaster.rendezvous.control.formation import Formation
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.records import Host


class FactDecisions:
    def __init__(self, job: Job, pool: HostPool, formation: Formation, drains: Drains) -> None:
        self.job, self.pool, self.formation, self.drains = job, pool, formation, drains
        self._rules: dict[type, Callable] = {
            AgentConnected: self._agent_connected, AgentLost: self._agent_lost,
            AgentUnreachable: self._agent_unreachable, WorkerExited: self._worker_exited,
            SessionClosed: self._session_closed, GenerationFailed: self._generation_failed,
            TrainingReturned: self._training_returned, HostsJoined: self._hosts_joined,
        }

    def decide(self, fact: Fact, now: float) -> bool:
        """Act on `fact`; True when it calls for another pass over the job."""
        return bool(self._rules[type(fact)](fact, now))

    def _agent_connected(self, fact: AgentConnected, now: float) -> None:
        self.formation.sent_to_agents.pop(fact.host, None)  # a new session needs the full picture
        self.drains.agent_connected(fact.host, fact.incarnation, now)
        self.job.on_agent_connected(fact, now)

    def _agent_lost(self, fact: AgentLost, now: float) -> None:
        self.formation.sent_to_agents.pop(fact.host, None)
        self.job.on_agent_lost(fact, now)

    def _agent_unreachable(self, fact: AgentUnreachable, now: float) -> None:
        if not self.pool.hosts.get(fact.host, Host(fact.host, 0)).agent_connected:
            self.job.emit(now, Kind.HOST_UNREACHABLE, host=fact.host, reason=fact.reason)
            self.job.blacklist_host(fact.host, f"its agent could not be started: {fact.reason}", now, by_itself=True)

    def _worker_exited(self, fact: WorkerExited, now: float) -> None:
        self.job.on_worker_exited(fact, now)

    def _session_closed(self, fact: SessionClosed, now: float) -> bool:
        return self.job.on_session_closed(fact, now)

    def _generation_failed(self, fact: GenerationFailed, now: float) -> None:
        gen = self.job.generation
        if gen is not None and gen.number == fact.generation and gen.over is None:
            self.job.end_generation(f"worker {fact.worker_id} reported: {fact.failure}", now)

    def _training_returned(self, fact: TrainingReturned, now: float) -> None:
        self.job.start_finishing(now)

    def _hosts_joined(self, fact: HostsJoined, now: float) -> None:
        self.job.causes.hosts_changed("agents", fact.change)
