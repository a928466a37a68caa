"""`ElasticRayExecutor`: an elastic Ringmaster job on a Ray cluster, from a Python function.

As `horovod.ray.ElasticRayExecutor`: the hosts are the cluster's alive nodes with the resources a
worker needs; the job grows when the autoscaler adds a node (at the next commit) and shrinks when
one dies (the survivors roll back to their last commit) or is drained (its workers leave at their
next commit). Where it differs from Horovod's:

- one agent per node (an actor pinned to it) starts the workers as processes, as on any host:
  recovery is Ringmaster's (no Ray task is rescheduled, nothing restarts but the ring);
- the rendezvous runs in the driver's process; `store="etcd://..."` keeps the job's state in
  etcd, but the agents are the driver's actors and end with it, so a job whose driver dies
  restarts from its last durable checkpoint (`checkpoint_dir`);
- `run(fn, args, kwargs)` returns every final rank's return value in rank order; there are no
  callbacks: events, the dashboard and `/metrics` say what the job does (`dashboard_url`);
- settings are arguments of the constructor (Horovod's `create_settings` bundled them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from typing import Any, Callable, Mapping, Sequence

from ringmaster.common import logs
from ringmaster.common.errors import RingmasterError
from ringmaster.common.secret import generate_secret
from ringmaster.ray.discovery import RayNodeDiscovery
from ringmaster.ray.launcher import RayLauncher
from ringmaster.ray.nodes import check_worker_resources
from ringmaster.rendezvous.control.records import JobOutcome
from ringmaster.rendezvous.server.launchers import AgentOptions, Launcher
from ringmaster.rendezvous.state.url import parse_store
from ringmaster.settings import DEFAULT_ELASTIC_TIMEOUT_S, JobSettings

#: What every worker runs: the training call the driver gave (`ringmaster.ray.worker_main`).
WORKER_COMMAND = ["-m", "ringmaster.ray.worker_main"]


#: The executor's names of the job settings it names differently.
_ARGUMENTS = {"min_np": "min_workers", "max_np": "max_workers"}


def _where(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "settings"


class RayJobFailed(RingmasterError):
    """The job ended without success; the message says why (as `ringmaster run` would)."""


class ElasticRayExecutor:
    """Runs a training function on between `min_workers` and `max_workers` workers of a Ray cluster.

    ```python
    ray.init(address="auto")
    executor = ElasticRayExecutor(min_workers=2, max_workers=8, cpus_per_worker=4)
    executor.start()
    results = executor.run(train, kwargs={"epochs": 10})   # every rank's return value
    executor.shutdown()
    ```
    Inside `train`, `import ringmaster.torch as hvd` works as in any worker.
    """

    def __init__(self, min_workers: int = 1, max_workers: int | None = None, cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0, *, elastic_timeout_s: float = DEFAULT_ELASTIC_TIMEOUT_S,
                 reset_limit: int | None = None, env_vars: Mapping[str, str] | None = None,
                 discovery_interval_s: float = 1.0, checkpoint_dir: str | None = None, store: str = "memory",
                 dashboard: bool = True, **settings: Any) -> None:
        """`settings`: any other field of the job's settings (`ringmaster run`'s flags, e.g.
        `heartbeat_interval_s`, `drain_grace_s`, `checkpoint_every`). Bad values raise
        ValueError naming them."""
        check_worker_resources(cpus_per_worker, gpus_per_worker)
        if isinstance(min_workers, int) and isinstance(max_workers, int) and max_workers < min_workers:
            raise ValueError(f"max_workers ({max_workers}) is below min_workers ({min_workers})")
        self.cpus_per_worker = float(cpus_per_worker)
        self.gpus_per_worker = float(gpus_per_worker)
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.store = parse_store(store)
        self.dashboard = dashboard
        from pydantic import ValidationError

        try:
            self.settings = JobSettings(
                command=[sys.executable, *WORKER_COMMAND], min_np=min_workers, max_np=max_workers,
                elastic_timeout_s=elastic_timeout_s, reset_limit=reset_limit, discovery_interval_s=discovery_interval_s,
                checkpoint_dir=os.path.abspath(checkpoint_dir) if checkpoint_dir else None, **settings)
        except ValidationError as exc:
            problems = "; ".join(f"{_ARGUMENTS.get(_where(e['loc']), _where(e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"ElasticRayExecutor: {problems}") from None
        self._discovery: RayNodeDiscovery | None = None
        self._launcher: RayLauncher | None = None
        self.dashboard_url: str | None = None
        self.last_outcome: JobOutcome | None = None

    def start(self) -> None:
        """Check the cluster can run the job: Ray is connected and some node takes a worker."""
        import ray

        if not ray.is_initialized():
            raise RuntimeError("ElasticRayExecutor.start(): this process is not connected to a Ray cluster; "
                               "call ray.init(address=...) first")
        self._discovery = RayNodeDiscovery(self.cpus_per_worker, self.gpus_per_worker, self._drain)
        if not self._discovery.find_hosts():
            raise RuntimeError(f"no alive Ray node has {self.cpus_per_worker:g} CPUs"
                               f"{f' and {self.gpus_per_worker:g} GPUs' if self.gpus_per_worker else ''} for a worker; "
                               "add nodes or ask for less (cpus_per_worker, gpus_per_worker)")

    def _drain(self, host: str) -> None:
        if self._launcher is not None:
            self._launcher.drain(host)

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """Run `fn(*args, **kwargs)` on every worker until the job ends; every final rank's return
        value, in rank order. Raises RayJobFailed (the reason) when the job does not succeed."""
        import ray
        from ray import cloudpickle

        if self._discovery is None:
            raise RuntimeError("ElasticRayExecutor.run(): call start() first")
        from ringmaster.rendezvous.server.app import RendezvousServer

        if not logs.configured():
            logs.configure()
        discovery = self._discovery
        call = ray.put(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))))
        environment = {**self.env_vars, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

        def make_launcher(options: AgentOptions, secret: str | None) -> Launcher:
            self._launcher = RayLauncher(options, secret, discovery.node_id, lambda host: hosts.get(host, 1),
                                         self.cpus_per_worker, self.gpus_per_worker, call, environment, os.getcwd())
            return self._launcher

        hosts = discovery.find_hosts()
        address = ray.util.get_node_ip_address()
        server = RendezvousServer(self.settings, _Remembering(discovery, hosts), bind=address, port=0,
                                  api_port=0 if self.dashboard else None, local_hosts=True, launcher=make_launcher,
                                  store=self.store, secret=generate_secret(), on_api=self._api_listening)
        try:
            outcome, interrupted = _run_to_end(server, dict(hosts))
            self.last_outcome = outcome
            launcher = self._launcher
            results = launcher.results() if launcher is not None and outcome.success else {}
        finally:
            if self._launcher is not None:
                self._launcher.release()
                self._launcher = None
        if interrupted:
            logging.getLogger(logs.RENDEZVOUS).warning("the job was stopped: %s", outcome.message)
            raise KeyboardInterrupt
        if not outcome.success:
            raise RayJobFailed(outcome.message)
        return [cloudpickle.loads(results[rank]) for rank in sorted(results)]

    def _api_listening(self, url: str) -> None:
        self.dashboard_url = url
        logging.getLogger(logs.RENDEZVOUS).info("the job's dashboard: %s", url)

    def shutdown(self) -> None:
        """End what is left of a job (its actors); Ray itself stays connected."""
        if self._launcher is not None:
            self._launcher.release()
            self._launcher = None
        self._discovery = None


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


def _run_to_end(server: Any, hosts: Mapping[str, int]) -> tuple[JobOutcome, bool]:
    """Run the rendezvous on its own loop in a thread (the caller may have a loop of its own):
    the job's outcome, and whether Ctrl-C stopped it (as `ringmaster run` stops: workers first)."""
    box: dict[str, Any] = {}
    loops: list[asyncio.AbstractEventLoop] = []

    async def lead() -> JobOutcome:
        loops.append(asyncio.get_running_loop())
        return await server.run(hosts)

    ended = threading.Event()

    def main() -> None:
        try:
            box["outcome"] = asyncio.run(lead())
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc
        finally:
            ended.set()

    thread = threading.Thread(target=main, name="ringmaster-rendezvous", daemon=True)
    thread.start()
    interrupted = False
    while not ended.is_set():  # (not Thread.join: a join that Ctrl-C interrupts can leave is_alive() False early)
        try:
            ended.wait(0.2)
        except KeyboardInterrupt:
            if loops and not interrupted:
                loops[0].call_soon_threadsafe(server.request_stop, "stopped by the user (KeyboardInterrupt)")
            interrupted = True
    if "error" in box:
        raise box["error"]
    return box["outcome"], interrupted
