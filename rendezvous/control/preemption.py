"""The whole job taken (Slurm's `--signal=B:USR1@90`, a preemption): every host is drained, so its
workers leave at their next commit, which rank 0 makes durable first (no host is left); then the
job ends as preempted, to resume from that checkpoint when started again. Workers still there
after the deadline are stopped (the last durable checkpoint)."""

from __future__ import annotations

from ringmaster.common.errors import Refused
from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.drains import Drains
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.records import DrainSource, JobOutcome


class Preemption:
    def __init__(self, job: Job, pool: HostPool, drains: Drains) -> None:
        self.job, self.pool, self.drains = job, pool, drains
        self.reason: str | None = None  # why the whole job was taken (`take`)

    def take(self, reason: str, deadline_s: float, now: float) -> bool:
        """Drain every host of the job; False when the job ended or was taken already."""
        job = self.job
        if job.outcome is not None or self.reason is not None:
            return False
        self.reason = reason
        job.emit(now, Kind.JOB_PREEMPTED, reason=reason, deadline_s=deadline_s,
                 checkpoint_dir=job.settings.checkpoint_dir or "")
        for host in list(self.pool.hosts.values()):
            if host.drain is None and (host.agent_connected or host.name in job.busy_hosts()):
                try:
                    self.drains.request(host.name, DrainSource.OPERATOR, deadline_s, reason, now)
                except Refused:
                    continue  # (a host that cannot be drained runs nothing to wait for)
        return True

    def end_when_left(self, now: float) -> None:
        """A preempted job ends once no worker of it is left."""
        job = self.job
        if self.reason is None or job.outcome is not None or job.live_workers():
            return
        where = job.settings.checkpoint_dir
        job.end_job(JobOutcome(False, f"preempted ({self.reason}): every worker left at a commit; "
                               + (f"started again, the job resumes from its checkpoint in {where}" if where
                                  else "no --checkpoint-dir, so started again it begins anew"),
                               interrupted=True, preempted=True), now)
