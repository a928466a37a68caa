"""One run of a job on a Ray cluster, in whatever process holds its rendezvous.

The driver holds it (`ElasticRayExecutor.run`), or a detached actor does (`detached=True`, so the
job outlives its driver): either way the rendezvous runs on a loop of its own in a thread (the
caller may have a loop, and a Ray actor's methods must stay free to answer), the agents are
actors pinned to the nodes (`RayLauncher`), and at the end the workers' results are read from the
agents' actors before those are released.
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ringmaster.common.errors import RingmasterError
from ringmaster.common.secret import generate_secret
from ringmaster.launch.launchers import AgentOptions, Launcher
from ringmaster.ray.discovery import RayNodeDiscovery
from ringmaster.ray.launcher import RayLauncher
from ringmaster.rendezvous.control.records import JobOutcome
from ringmaster.rendezvous.state.url import StoreSpec
from ringmaster.settings import JobSettings


class RayJobFailed(RingmasterError):
    """The job ended without success; the message says why (as `ringmaster run` would)."""


@dataclass(frozen=True)
class RayJobSpec:
    """Everything a job's run needs, checked by the executor; it travels to a detached actor
    whole (Ray pickles it, as it sends any actor's arguments: the driver's own objects)."""

    settings: JobSettings
    store: StoreSpec
    cpus_per_worker: float
    gpus_per_worker: float
    call: bytes  # the training call, serialized by the driver
    environment: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    dashboard: bool = True


@dataclass(frozen=True)
class RayJobEnd:
    """How a run ended: its outcome, and each final rank's serialized return value (success only)."""

    outcome: JobOutcome
    results: Mapping[int, bytes]


class RayJob:
    """Starts the job's rendezvous at once; `wait` says when it has ended and how."""

    def __init__(self, spec: RayJobSpec, on_api: Callable[[str], None] | None = None) -> None:
        import ray

        from ringmaster.rendezvous.server.app import RendezvousServer

        self._spec = spec
        self._launcher: RayLauncher | None = None
        self._discovery = RayNodeDiscovery(spec.cpus_per_worker, spec.gpus_per_worker, self._drain)
        self._hosts = self._discovery.find_hosts()
        self._call = ray.put(spec.call)  # owned by this process: agents started later still find it
        self._server = RendezvousServer(
            spec.settings, _Remembering(self._discovery, self._hosts), bind=ray.util.get_node_ip_address(), port=0,
            api_port=0 if spec.dashboard else None, local_hosts=True, launcher=self._make_launcher, store=spec.store,
            secret=generate_secret(), on_api=on_api)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_reason: str | None = None
        self._ended = threading.Event()
        self._end: RayJobEnd | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="ringmaster-rendezvous", daemon=True)
        self._thread.start()

    def _make_launcher(self, options: AgentOptions, secret: str | None) -> Launcher:
        hosts = self._hosts
        self._launcher = RayLauncher(options, secret, self._discovery.node_id, lambda host: hosts.get(host, 1),
                                     self._spec.cpus_per_worker, self._spec.gpus_per_worker, self._call,
                                     self._spec.environment, self._spec.cwd)
        return self._launcher

    def _drain(self, host: str) -> None:
        if self._launcher is not None:
            self._launcher.drain(host)

    def _main(self) -> None:
        try:
            outcome = asyncio.run(self._lead())
            launcher = self._launcher
            results = launcher.results() if launcher is not None and outcome.success else {}
            self._end = RayJobEnd(outcome, results)
        except BaseException as exc:  # handed to whoever waits
            self._error = exc
        finally:
            if self._launcher is not None:
                self._launcher.release()
                self._launcher = None
            self._ended.set()

    async def _lead(self) -> JobOutcome:
        self._loop = asyncio.get_running_loop()
        if self._stop_reason is not None:  # asked to stop before the loop ran
            self._server.request_stop(self._stop_reason)
        return await self._server.run(dict(self._hosts))

    def stop(self, reason: str) -> None:
        """Stop the job as `ringmaster run` stops on Ctrl-C: workers first, the job ends as failed."""
        self._stop_reason = reason
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._server.request_stop, reason)
            except RuntimeError:  # the loop closed in between: the job has ended anyway
                pass

    def wait(self, timeout_s: float | None) -> RayJobEnd | None:
        """How the job ended, or None if it still runs after `timeout_s`; raises what the
        rendezvous raised (a store it cannot reach, another leader of the same prefix)."""
        if not self._ended.wait(timeout_s):
            return None
        if self._error is not None:
            raise self._error
        assert self._end is not None
        return self._end

    @property
    def ended(self) -> bool:
        return self._ended.is_set()


class _Remembering:
    """Discovery that keeps the latest host set where the launcher reads each host's slots."""

    def __init__(self, discovery: RayNodeDiscovery, hosts: dict[str, int]) -> None:
        self._discovery = discovery
        self._hosts = hosts

    def describe(self) -> str:
        return self._discovery.describe()

    def find_hosts(self) -> dict[str, int]:
        found = self._discovery.find_hosts()
        self._hosts.clear()
        self._hosts.update(found)
        return found


def worker_environment(env_vars: Mapping[str, str], path: list[str]) -> dict[str, str]:
    """The workers' environment: the user's variables, and the driver's import path (the training
    function's module must import on every node as it does on the driver)."""
    return {**env_vars, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
