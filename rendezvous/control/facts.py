"""What the coordinator's inputs observed, kept until it decides on them.

An input method checks and records (a heartbeat's time, a worker's flags) and, where the
observation calls for a decision, queues one of these facts; `Coordinator.settle` then decides
on the facts in the order they came, in one place (`_decide`), before it reconciles the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ringmaster.discovery import HostDiff


@dataclass(frozen=True)
class AgentConnected:
    """An agent opened a session, running `running` (its workers not among them are gone)."""

    host: str
    running: frozenset[str]
    incarnation: str = ""  # the agent process (a drain its predecessor asked for ends)


@dataclass(frozen=True)
class AgentLost:
    """An agent's session closed, or its heartbeats or store lease ran out (`silent`: the host
    may be alive beyond a partition, or frozen)."""

    host: str
    reason: str
    silent: bool = False


@dataclass(frozen=True)
class AgentUnreachable:
    """The agent of a host could not be started there (ssh refused, the host down, a bad key)."""

    host: str
    reason: str


@dataclass(frozen=True)
class WorkerExited:
    """A worker process exited, as its agent saw it."""

    host: str
    worker_id: str
    exit_code: int
    signal: int
    stopped_by_agent: bool
    output: str = ""  # what it wrote last to stderr, after an error


@dataclass(frozen=True)
class SessionClosed:
    """A worker's session with the rendezvous closed (its process is most likely gone)."""

    worker_id: str


@dataclass(frozen=True)
class GenerationFailed:
    """A worker reported that its generation failed (a collective, or building the ring)."""

    worker_id: str
    generation: int
    failure: str


@dataclass(frozen=True)
class TrainingReturned:
    """A worker's training function returned."""

    worker_id: str


@dataclass(frozen=True)
class HostsJoined:
    """The host set changed because agents joined or left by connecting (`--hosts-from-agents`),
    not because discovery said so."""

    change: HostDiff


Fact = Union[AgentConnected, AgentLost, AgentUnreachable, WorkerExited, SessionClosed, GenerationFailed,
             TrainingReturned,
             HostsJoined]
