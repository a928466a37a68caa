"""What the coordinator's decisions ask for, as typed values: the server turns them into
protobuf messages on the agents' and workers' streams (`rendezvous/server/wire.py`), and the
host pool's into work for the launcher (`rendezvous/server/launchers.py`).

The decision core never builds a wire message, so it is tested by reading these values, and
the protocol can change without touching a decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Union

from ringmaster.rendezvous.control.assignment import RankAssignment


@dataclass(frozen=True)
class WorkerLaunch:
    """One process an agent must run: its id, its slot on the host, its command and environment."""

    worker_id: str
    slot: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------- to agents
@dataclass(frozen=True)
class RunWorkers:
    """The complete list of workers `host`'s agent must run now (others are stopped)."""

    host: str
    workers: tuple[WorkerLaunch, ...]


@dataclass(frozen=True)
class StopAgent:
    """`host`'s agent stops its workers and exits (the job ended, or the host counts as lost)."""

    host: str
    reason: str


# ---------------------------------------------------------------------- to the launcher
@dataclass(frozen=True)
class LaunchAgent:
    """Start an agent for `host` (here, over ssh, ... as the launcher does it)."""

    host: str


@dataclass(frozen=True)
class StopLaunchedAgent:
    """Stop the agent started for `host` (its host left discovery and runs nothing)."""

    host: str


# ---------------------------------------------------------------------- to workers
@dataclass(frozen=True)
class Assign:
    """A worker's place in a formed generation (its ranks, as `assign_ranks` gave them) and
    where its ring meets."""

    place: RankAssignment
    generation: int
    store_host: str
    store_port: int
    store_prefix: str
    hosts_sequence: int

    @property
    def worker_id(self) -> str:
        return self.place.worker_id


@dataclass(frozen=True)
class EndGeneration:
    """The worker's generation is over (a member failed): roll back and say Ready, unless
    `rejoin`: a worker inside `hvd.elastic.run` is placed in the next generation without asking
    (formation.py, `_rejoins_at_once`), so it only waits for its place (a large job's 32,768
    `Ready` calls cost the rendezvous seconds)."""

    worker_id: str
    generation: int
    reason: str
    rejoin: bool = False


@dataclass(frozen=True)
class AnnounceHosts:
    """The ring will change once newcomers have warmed up: not an interrupt (`UpdateHosts` is),
    the notice a Horovod script waits for after a discovery change (`state._host_messages`).
    Said alike to `worker_id` and every worker in `also` (see `UpdateHosts.also`)."""

    worker_id: str
    sequence: int
    reason: str
    also: tuple[str, ...] = ()


@dataclass(frozen=True)
class UpdateHosts:
    """The ring should change: raise HostsUpdatedInterrupt at the next commit."""

    worker_id: str
    sequence: int
    reason: str
    checkpoint: bool = False  # rank 0 makes the commit durable before anyone leaves (a drain leaves too few)
    #: Told its next place (or to leave) unasked once a member reports the commit (`HostUpdates.send`),
    #: in `generation`.
    placed: bool = False
    generation: int = 0
    #: The same word for these workers too: a host update goes to every member (32,768 at 4,096 x 8),
    #: one effect for them all instead of one each (`one_per_worker` gives them one by one).
    also: tuple[str, ...] = ()


@dataclass(frozen=True)
class Retire:
    """The job does not need this worker any more: it exits 0. Said alike to every worker in
    `also` (the workers of a host that left: half of a 4,096 x 8 job leaving was 16,384 effects,
    each sorted into its host's command one by one; see `UpdateHosts.also`)."""

    worker_id: str
    reason: str
    also: tuple[str, ...] = ()


@dataclass(frozen=True)
class EndJob:
    """The job is over; the worker exits with the job's verdict."""

    worker_id: str
    success: bool
    reason: str


def one_per_worker(effect: WorkerEffect) -> list[WorkerEffect]:
    """An effect said alike to several workers (`also`) as one effect per worker, in order: for
    readers that take them one by one (the decisions' tests, a stream per worker)."""
    if not isinstance(effect, (UpdateHosts, AnnounceHosts, Retire)) or not effect.also:
        return [effect]
    return [replace(effect, worker_id=worker_id, also=()) for worker_id in (effect.worker_id, *effect.also)]


PoolEffect = Union[LaunchAgent, StopLaunchedAgent]
AgentEffect = Union[RunWorkers, StopAgent]
WorkerEffect = Union[Assign, EndGeneration, UpdateHosts, AnnounceHosts, Retire, EndJob]
Effect = Union[AgentEffect, WorkerEffect, PoolEffect]
