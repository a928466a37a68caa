"""`RayLauncher`: each host's agent is an actor pinned to that host's Ray node.

The same `Launcher` contract as the ssh and Slurm launchers: `start(host)` starts the agent
(here: creates the node's actor, with a node-affinity strategy that never places it elsewhere),
`stop(host)` stops it, `ended()` says which agents ended and how, through the same path as every
other input. A node that dies takes its actor and agent with it, which `ended` reports.

After the job ends, `stop_all` stops the agents but keeps the actors: the executor reads the
workers' results from them, then `release`s them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ringmaster.common.handover import handover
from ringmaster.common.keys import agent_key
from ringmaster.launch.launch_plan import agent_command
from ringmaster.launch.launchers import AgentOptions, Launcher
from ringmaster.ray.agent_actor import AgentProcess


@dataclass
class _Actor:
    handle: Any
    ended: Any  # the reference `wait` answers once the agent has ended


class RayLauncher(Launcher):
    starts_agents = True

    def __init__(self, options: AgentOptions, secret: str | None, node_id: Callable[[str], str | None],
                 slots: Callable[[str], int], cpus_per_worker: float, gpus_per_worker: float, call: Any,
                 environment: Mapping[str, str], cwd: str | None) -> None:
        """`node_id(host)` and `slots(host)` come from discovery; `call` is the training call in
        Ray's object store, handed to every actor."""
        self._options = options
        self._secret = secret
        self._node_id = node_id
        self._slots = slots
        self._cpus_per_worker = cpus_per_worker
        self._gpus_per_worker = gpus_per_worker
        self._call = call
        self._actor_class: Any = None  # `ray.remote(AgentProcess)`, made once at the first start
        self._environment = dict(environment)
        self._cwd = cwd
        self.actors: dict[str, _Actor] = {}
        self.finished: dict[str, _Actor] = {}  # agents that ended, whose actors may hold results
        self._not_started: list[tuple[str, str]] = []

    def start(self, host: str) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if host in self.actors:
            return
        node_id = self._node_id(host)
        if node_id is None:
            self._not_started.append((host, "no alive Ray node is this host any more"))
            return
        o = self._options
        argv = agent_command("python", o.rendezvous, host, o.heartbeat_interval_s, o.stop_grace_s, remote=False,
                             reconnect_timeout_s=o.reconnect_timeout_s, spares=o.spares, drain_grace_s=o.drain_grace_s)
        key = agent_key(self._secret, host).hex() if self._secret is not None else ""
        slots = max(1, self._slots(host))
        if self._actor_class is None:
            self._actor_class = ray.remote(AgentProcess)
        handle = self._actor_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            num_cpus=slots * self._cpus_per_worker, num_gpus=slots * self._gpus_per_worker,
            max_concurrency=4,  # `wait` blocks one thread; drain, stop and results use the others
            name=None, max_restarts=0,
        ).remote(argv, handover(key, {}), self._environment, self._call, self._cwd)
        self.actors[host] = _Actor(handle, handle.wait.remote())

    def drain(self, host: str) -> None:
        """Ray drains the node of `host`: its agent drains the host."""
        actor = self.actors.get(host)
        if actor is not None:
            actor.handle.drain.remote()

    def stop(self, host: str) -> None:
        actor = self.actors.get(host)
        if actor is not None:
            actor.handle.stop.remote()

    def ended(self) -> list[tuple[str, str]]:
        out, self._not_started = self._not_started, []
        out += [(host, self._how(actor)) for host, actor in self._collect_ended()]
        return out

    def _collect_ended(self) -> list[tuple[str, _Actor]]:
        import ray

        if not self.actors:
            return []
        waiting = {actor.ended: host for host, actor in self.actors.items()}
        ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        out = []
        for ref in ready:
            host = waiting[ref]
            actor = self.actors.pop(host)
            self.finished[host] = actor
            out.append((host, actor))
        return out

    @staticmethod
    def _how(actor: _Actor) -> str:
        import ray

        try:
            code, lines = ray.get(actor.ended, timeout=5)
        except ray.exceptions.RayError as exc:  # the node died, or the actor could not be placed
            return f"its Ray actor ended: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        said = " / ".join(line for line in lines if line) or "(it printed nothing)"
        return f"its agent exited with code {code}: {said}"

    def alive(self) -> int:
        self.finished.update(dict(self._collect_ended()))
        return len(self.actors)

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """Stop every agent and wait for them (killing what is left after `timeout_s`); the actors
        stay, with the workers' results, until `release`."""
        import ray

        for actor in self.actors.values():
            actor.handle.stop.remote()
        deadline = time.monotonic() + timeout_s
        pending = [actor.ended for actor in self.actors.values()]
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=max(0.0, deadline - time.monotonic()))
        for actor in self.actors.values():
            actor.handle.kill.remote()
        self.finished.update(self.actors)
        self.actors.clear()

    def results(self, timeout_s: float = 30.0) -> dict[int, bytes]:
        """rank -> serialized return value, from every actor still reachable."""
        import ray

        out: dict[int, bytes] = {}
        refs = [actor.handle.results.remote() for actor in self.finished.values()]
        for ref in refs:
            try:
                out.update(ray.get(ref, timeout=timeout_s))
            except ray.exceptions.RayError:
                continue  # its node is gone: its workers did not finish there
        return out

    def release(self) -> None:
        """End every actor (their folders removed first where they still answer)."""
        import ray

        every = [*self.actors.values(), *self.finished.values()]
        cleanups = [actor.handle.release.remote() for actor in every]
        if cleanups:
            ray.wait(cleanups, num_returns=len(cleanups), timeout=10)
        for actor in every:
            try:
                ray.kill(actor.handle)
            except Exception:  # already gone
                pass
        self.actors.clear()
        self.finished.clear()
