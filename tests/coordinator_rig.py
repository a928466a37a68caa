"""A coordinator driven without I/O: a manual clock, and what it said per agent and worker."""

from __future__ import annotations

from typing import Any, Callable

from ringmaster.rendezvous.control.coordinator import Coordinator, RingStoreAddress
from ringmaster.rendezvous.control.effects import (
    LaunchAgent,
    PoolEffect,
    RunWorkers,
    StopAgent,
    StopLaunchedAgent,
    UpdateHosts,
    WorkerEffect,
    WorkerLaunch,
    one_per_worker,
)
from ringmaster.rendezvous.control.records import Generation, JobOutcome
from ringmaster.rendezvous.state import job_record
from ringmaster.settings import JobSettings


class Rig:
    """A coordinator plus what it said, per agent and per worker; settles after every call."""

    def __init__(self, **settings) -> None:
        settings.setdefault("command", ["python", "train.py"])
        self.plain_stores: list[int] = []
        self.coordinator = Coordinator(
            JobSettings(**settings), "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2), self._plain_store
        )
        self.now = 0.0
        self.agents: dict[str, RunWorkers | StopAgent] = {}
        self.worker_events: dict[str, list[WorkerEffect]] = {}
        self.launches: list[PoolEffect] = []  # agents to start and stop (where the server launches them)
        self.snapshots = job_record.Snapshots()  # as the journal keeps them: records rebuilt where changed

    def _plain_store(self, generation: int) -> tuple[str, int]:
        self.plain_stores.append(generation)
        return "127.0.0.1", 1000 + generation

    def __getattr__(self, name):
        method = getattr(self.coordinator, name)

        def call(*args, **kwargs):
            result = method(*args, self.now, **kwargs)
            self.coordinator.settle(self.now)  # as the gRPC layer does after each batch of calls
            for effect in self.coordinator.drain():
                if isinstance(effect, (RunWorkers, StopAgent)):
                    self.agents[effect.host] = effect
                elif isinstance(effect, (LaunchAgent, StopLaunchedAgent)):
                    self.launches.append(effect)
                else:
                    for one in one_per_worker(effect):  # (what is said alike to several, each its own)
                        self.worker_events.setdefault(one.worker_id, []).append(one)
            return result

        return call

    def gen(self) -> Generation | None:
        """The current generation (a call: a type checker does not carry an `is None` over it)."""
        return self.coordinator.generation

    def outcome(self) -> JobOutcome | None:
        return self.coordinator.outcome

    def specs(self, host: str) -> dict[str, WorkerLaunch]:
        command = self.agents[host]
        return {s.worker_id: s for s in command.workers} if isinstance(command, RunWorkers) else {}

    def kinds(self, worker_id: str) -> list[type]:
        return [type(e) for e in self.worker_events.get(worker_id, [])]

    def last(self, worker_id: str, kind: type):
        return [e for e in self.worker_events[worker_id] if isinstance(e, kind)][-1]

    def start_elastic(self, hosts: dict[str, int]) -> list[str]:
        """Discover, connect agents, register every planned worker as elastic."""
        self.set_hosts(hosts)
        for pid, host in enumerate(hosts, start=100):
            self.agent_connected(host, pid)
        ids = [a.worker_id for a in self.coordinator.generation.members]
        for wid in ids:
            self.worker_connected(wid, 1)
            self.worker_heartbeat(wid, 0, True)
        return ids


    def commit_at_update(self, ids: list[str], generation: int) -> None:
        """Members reach their commit at a host update, as real workers do: the one its update
        did not place unasked (`UpdateHosts.placed`) reports it with its `Ready`, the others wait
        for their word."""
        for worker_id in ids:
            update = self.last(worker_id, UpdateHosts)
            if not update.placed:
                self.worker_ready(worker_id, generation, "", True)


def record(rig: Rig) -> dict[str, dict]:
    """The rig's job as the store keeps it (keys relative to the job's prefix), as the journal builds it."""
    return job_record.job_values(rig.coordinator.saved(), rig.snapshots)


def api_for(coordinator: Coordinator, clock: Callable[[], float] = lambda: 0.0, **options: Any):
    """The control API of `coordinator` at `clock`'s time, changing it as the rendezvous' inputs
    do (the call, with the time; settling is the test's)."""
    from ringmaster.rendezvous.control.view import ALL_ROWS
    from ringmaster.rendezvous.server.http_api import create_app

    return create_app(lambda page=ALL_ROWS: coordinator.view(clock(), page), lambda np: coordinator.scale(np, clock()),
                      drain=lambda host, deadline: coordinator.drain_host(host, deadline, clock()),
                      undrain=lambda host: coordinator.undrain_host(host, clock()), **options)
