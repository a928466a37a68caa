"""`ElasticRayExecutor`: an elastic Ringmaster job on a Ray cluster, from a Python function.

As `horovod.ray.ElasticRayExecutor`: the hosts are the cluster's alive nodes with the resources a
worker needs; the job grows when the autoscaler adds a node (at the next commit) and shrinks when
one dies (the survivors roll back to their last commit) or is drained (its workers leave at their
next commit). Where it differs from Horovod's:

- one agent per node (an actor pinned to it) starts the workers as processes, as on any host:
  recovery is Ringmaster's (no Ray task is rescheduled, nothing restarts but the ring);
- the rendezvous runs in the driver's process, or, with `detached=True, name=...`, in a detached
  actor of its own, so the job goes on when the driver ends and any driver follows it by name
  (`ElasticRayExecutor.attach(name)`); with `store="etcd://..."` too, Ray restarts that actor if
  it dies and the job carries on from etcd (`ringmaster.ray.detached`);
- `run(fn, args, kwargs)` returns every final rank's return value in rank order; there are no
  callbacks: events, the dashboard and `/metrics` say what the job does (`dashboard_url`);
- settings are arguments of the constructor (Horovod's `create_settings` bundled them).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Mapping, Sequence

from ringmaster.common import logs
from ringmaster.ray.detached import NAMESPACE, DetachedRayJob, JobHolder, actor_name, check_name
from ringmaster.ray.discovery import RayNodeDiscovery
from ringmaster.ray.job import RayJob, RayJobEnd, RayJobFailed, RayJobSpec, worker_environment
from ringmaster.ray.nodes import check_worker_resources
from ringmaster.rendezvous.control.records import JobOutcome
from ringmaster.rendezvous.state.url import parse_store
from ringmaster.settings import DEFAULT_ELASTIC_TIMEOUT_S, JobSettings, nearest_whole_groups

#: What every worker runs: the training call the driver gave (`ringmaster.ray.worker_main`).
WORKER_COMMAND = ["-m", "ringmaster.ray.worker_main"]


#: The executor's names of the job settings it names differently.
_ARGUMENTS = {"min_np": "min_workers", "max_np": "max_workers"}


def _where(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "settings"


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
                 dashboard: bool = True, detached: bool = False, name: str | None = None, group_size: int = 1,
                 **settings: Any) -> None:
        """`settings`: any other field of the job's settings (`ringmaster run`'s flags, e.g.
        `heartbeat_interval_s`, `drain_grace_s`, `checkpoint_every`). Bad values raise
        ValueError naming them. `detached=True` (with a `name`) runs the job's rendezvous in an
        actor of its own that outlives this driver. `group_size`: workers per replica group
        (`--group-size`: FSDP2 inside a group, `hvd.elastic.mesh()`): the job grows and shrinks by
        whole groups, so `min_workers` and `max_workers` must count whole groups."""
        check_worker_resources(cpus_per_worker, gpus_per_worker)
        if detached and name is None:
            raise ValueError("detached=True: give the job a name too (name='...'), by which any driver follows it")
        self.detached = bool(detached)
        self.name = check_name(name) if name is not None else None
        if isinstance(min_workers, int) and isinstance(max_workers, int) and max_workers < min_workers:
            raise ValueError(f"max_workers ({max_workers}) is below min_workers ({min_workers})")
        if isinstance(group_size, int) and group_size >= 1:
            for argument, count in (("min_workers", min_workers), ("max_workers", max_workers)):
                if isinstance(count, int) and count >= 1 and count % group_size:
                    raise ValueError(f"{argument}={count} is not a whole number of replica groups of group_size="
                                     f"{group_size}: give {nearest_whole_groups(count, group_size)}")
        self.cpus_per_worker = float(cpus_per_worker)
        self.gpus_per_worker = float(gpus_per_worker)
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.store = parse_store(store)
        self.dashboard = dashboard
        from pydantic import ValidationError

        try:
            self.settings = JobSettings(
                command=[sys.executable, *WORKER_COMMAND], min_np=min_workers, max_np=max_workers, elastic=True,
                group_size=group_size,
                elastic_timeout_s=elastic_timeout_s, reset_limit=reset_limit, discovery_interval_s=discovery_interval_s,
                checkpoint_dir=os.path.abspath(checkpoint_dir) if checkpoint_dir else None, **settings)
        except ValidationError as exc:
            problems = "; ".join(
                f"{_ARGUMENTS.get(_where(e['loc']), _where(e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"ElasticRayExecutor: {problems}") from None
        self._started = False
        self.dashboard_url: str | None = None
        self.last_outcome: JobOutcome | None = None

    def start(self) -> None:
        """Check the cluster can run the job: Ray is connected and some node takes a worker."""
        import ray

        if not ray.is_initialized():
            raise RuntimeError("ElasticRayExecutor.start(): this process is not connected to a Ray cluster; "
                               "call ray.init(address=...) first")
        if not RayNodeDiscovery(self.cpus_per_worker, self.gpus_per_worker).find_hosts():
            raise RuntimeError(f"no alive Ray node has {self.cpus_per_worker:g} CPUs"
                               f"{f' and {self.gpus_per_worker:g} GPUs' if self.gpus_per_worker else ''} for a worker; "
                               "add nodes or ask for less (cpus_per_worker, gpus_per_worker)")
        self._started = True

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (),
            kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """Run `fn(*args, **kwargs)` on every worker until the job ends; every final rank's return
        value, in rank order. Raises RayJobFailed (the reason) when the job does not succeed.
        Detached, this driver only waits: Ctrl-C (or its death) leaves the job running."""
        if self.detached:
            handle = self.submit(fn, args, kwargs)
            try:
                ended = handle.result()
            except KeyboardInterrupt:
                logging.getLogger(logs.RENDEZVOUS).warning(
                    "the job %r goes on in its detached actor: ElasticRayExecutor.attach(%r) follows it "
                    "(.result(), .stop())", handle.name, handle.name)
                raise
            assert ended is not None
            return self._returned(ended)
        spec = self._spec(fn, args, kwargs)
        job = RayJob(spec, on_api=self._api_listening)
        interrupted = False
        while (end := self._wait(job)) is None:
            interrupted = True
            job.stop("stopped by the user (KeyboardInterrupt)")
        if interrupted:
            self.last_outcome = end.outcome
            logging.getLogger(logs.RENDEZVOUS).warning("the job was stopped: %s", end.outcome.message)
            raise KeyboardInterrupt
        return self._returned(end)

    @staticmethod
    def _wait(job: RayJob) -> RayJobEnd | None:
        """The job's end; None when Ctrl-C came while waiting (the caller stops the job and waits again)."""
        try:
            while (end := job.wait(0.2)) is None:  # short waits: Ctrl-C lands between them
                pass
            return end
        except KeyboardInterrupt:
            return None

    def submit(self, fn: Callable[..., Any], args: Sequence[Any] = (),
               kwargs: Mapping[str, Any] | None = None) -> DetachedRayJob:
        """Detached only: hand the job to its actor and return at once; `.result()` waits for it."""
        import ray

        if not self.detached or self.name is None:
            raise RuntimeError("ElasticRayExecutor.submit(): only a detached job (detached=True, name=...) runs "
                               "without its driver; run() runs this one")
        spec = self._spec(fn, args, kwargs)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        taken = RayJobFailed(f"a job named {self.name!r} already runs on this Ray cluster: "
                             f"ElasticRayExecutor.attach({self.name!r}) follows it, or choose another name")
        try:
            ray.get_actor(actor_name(self.name), namespace=NAMESPACE)
        except ValueError:
            pass  # no such actor: the name is free
        else:
            raise taken
        try:
            holder = ray.remote(JobHolder).options(
                name=actor_name(self.name), namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                # On etcd a holder that dies is restarted and takes the job over; calls to it wait for that.
                max_restarts=-1 if self.store.kind == "etcd" else 0,
                max_task_retries=-1 if self.store.kind == "etcd" else 0, max_concurrency=4,
                scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True),
            ).remote(spec)
        except ValueError:  # another driver took the name in between
            raise taken from None
        job = DetachedRayJob(self.name, holder)
        if self.dashboard:
            self.dashboard_url = job.dashboard_url(timeout_s=60)
        return job

    @staticmethod
    def attach(name: str) -> DetachedRayJob:
        """Follow a detached job by its name, from any driver of the cluster."""
        return DetachedRayJob.attach(name)

    def _spec(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> RayJobSpec:
        from ray import cloudpickle

        if not self._started:
            raise RuntimeError("ElasticRayExecutor.run(): call start() first")
        if not logs.configured():
            logs.configure()
        return RayJobSpec(self.settings, self.store, self.cpus_per_worker, self.gpus_per_worker,
                          cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))),
                          worker_environment(self.env_vars, sys.path), os.getcwd(), self.dashboard)

    def _returned(self, end: RayJobEnd) -> list[Any]:
        from ray import cloudpickle

        self.last_outcome = end.outcome
        if not end.outcome.success:
            raise RayJobFailed(end.outcome.message)
        return [cloudpickle.loads(end.results[rank]) for rank in sorted(end.results)]

    def _api_listening(self, url: str) -> None:
        self.dashboard_url = url
        logging.getLogger(logs.RENDEZVOUS).info("the job's dashboard: %s", url)

    def shutdown(self) -> None:
        """Forget the cluster; Ray itself stays connected. A detached job goes on
        (`attach(name).stop()` ends it); a driver's job has ended with its `run`."""
        self._started = False
