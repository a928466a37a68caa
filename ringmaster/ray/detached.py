"""A job that outlives its driver: its rendezvous in a detached, named Ray actor.

`ElasticRayExecutor(..., detached=True, name="resnet")` hands the job to a `JobHolder` actor
(Ray's `lifetime="detached"`, named in the `ringmaster` namespace). The holder runs the job's
rendezvous; the agents' actors are the holder's, so they and the workers go on when the driver
ends, whether it returns, is interrupted or is killed. Any driver of the cluster follows the job
by its name (`ElasticRayExecutor.attach("resnet")`), reads its result (which ends the holder) or
stops it.

With `store="etcd://..."` the holder is restarted by Ray when its process or node dies, and the
restarted one takes the job over from etcd: its agents died with the old holder (Ray ends an
actor with its owner), so the workers start again from the last durable checkpoint, as after any
rendezvous restart whose agents are gone. With the memory store a holder that dies ends the job.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from typing import Any

from ringmaster.common import logs
from ringmaster.ray.job import RayJob, RayJobEnd, RayJobFailed, RayJobSpec
from ringmaster.rendezvous.state.leadership import AnotherLeader

#: Detached jobs' actors live in this Ray namespace, named `ringmaster-job-NAME`.
NAMESPACE = "ringmaster"
#: What a detached job's name may be (it names a Ray actor, shown by `ray list actors`).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
#: How long a restarted holder waits for its dead predecessor's leader key to lapse.
TAKEOVER_WAIT_S = 30.0
#: How often a waiting driver asks the holder (a dead holder is noticed within this).
POLL_S = 1.0

log = logging.getLogger(logs.RENDEZVOUS)


def check_name(name: object) -> str:
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise ValueError(f"name={name!r}: a detached job's name is 1-63 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit (it names the job's Ray actor)")
    return name


def actor_name(name: str) -> str:
    return f"ringmaster-job-{name}"


class JobHolder:
    """The detached actor (plain Python: `ray.remote` makes the actor of it)."""

    def __init__(self, spec: RayJobSpec) -> None:
        import ray

        if not logs.configured():
            logs.configure()
        self._url: str | None = None
        self._heard_url = threading.Event()
        with warnings.catch_warnings():  # Ray's property reads a deprecated one of its own and says so
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._job = self._start(spec, restarted)

    def _start(self, spec: RayJobSpec, restarted: bool) -> RayJob:
        """A restarted holder waits (within TAKEOVER_WAIT_S) for the dead one's leadership to lapse."""
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while True:
            job = RayJob(spec, on_api=self._listening)
            if not restarted:
                return job
            try:
                job.wait(timeout_s=5.0)  # leading and running, or ended at once (`wait` keeps how)
                return job
            except AnotherLeader:
                if time.monotonic() >= deadline:
                    raise
                log.info("the job's previous rendezvous still holds its leadership; waiting for it to lapse")
                time.sleep(0.5)  # a lease lapses on etcd's clock: nothing here to wait on sooner

    def _listening(self, url: str) -> None:
        self._url = url
        self._heard_url.set()
        log.info("the job's dashboard: %s", url)

    def dashboard_url(self, wait_s: float) -> str | None:
        """The control API's URL, once it listens (within `wait_s`; None without a dashboard)."""
        deadline = time.monotonic() + max(0.0, min(float(wait_s), 60.0))
        while not self._heard_url.wait(0.2) and not self._job.ended and time.monotonic() < deadline:
            pass
        return self._url

    def wait(self, timeout_s: float) -> RayJobEnd | None:
        """The job's end, or None while it runs after `timeout_s`."""
        return self._job.wait(max(0.0, min(float(timeout_s), 60.0)))

    def stop(self, reason: str) -> None:
        self._job.stop(str(reason)[:500])


class DetachedRayJob:
    """A driver's handle on a detached job, by its name."""

    def __init__(self, name: str, holder: Any) -> None:
        self.name = name
        self._holder = holder

    @classmethod
    def attach(cls, name: str) -> "DetachedRayJob":
        import ray

        check_name(name)
        if not ray.is_initialized():  # (Ray's own calls would start a cluster of their own here)
            raise RuntimeError("ElasticRayExecutor.attach(): this process is not connected to a Ray cluster; "
                               "call ray.init(address=...) first")
        try:
            holder = ray.get_actor(actor_name(name), namespace=NAMESPACE)
        except ValueError:
            raise LookupError(f"no Ringmaster job named {name!r} runs on this Ray cluster (its result may have been "
                              "read already); ElasticRayExecutor(..., detached=True, name=...) starts one") from None
        return cls(name, holder)

    def dashboard_url(self, timeout_s: float = 30.0) -> str | None:
        import ray

        return ray.get(self._holder.dashboard_url.remote(timeout_s), timeout=timeout_s + 60)

    def done(self) -> bool:
        """Whether the job has ended (its result waits to be read)."""
        return self._end(0.0) is not None

    def stop(self, reason: str = "stopped by the user") -> None:
        """Stop the job (workers first); `result` then raises RayJobFailed with `reason`."""
        import ray

        ray.get(self._holder.stop.remote(reason), timeout=30)

    def result(self, timeout_s: float | None = None) -> RayJobEnd | None:
        """Wait for the job's end (None after `timeout_s`), then end the holder: the result is read
        once. Raises RayJobFailed when the holder died without one."""
        import ray

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            end = self._end(max(0.0, left))
            if end is not None:
                ray.kill(self._holder, no_restart=True)
                return end
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _end(self, wait_s: float) -> RayJobEnd | None:
        import ray

        try:
            return ray.get(self._holder.wait.remote(wait_s), timeout=wait_s + 60)
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            # A holder Ray is restarting (or one too starved to answer) has not ended: not yet.
            # Ray raises the first at once while the actor is away, hence the pause.
            time.sleep(min(max(wait_s, 0.1), POLL_S))
            return None
        except ray.exceptions.RayActorError as exc:
            raise RayJobFailed(f"the actor holding job {self.name!r} ended without a result: "
                               f"{str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}") from None
        except ray.exceptions.RayTaskError as exc:  # the rendezvous could not run the job
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise RayJobFailed(f"job {self.name!r}: {str(cause).splitlines()[0][:500]}") from None
