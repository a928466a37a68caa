"""A job carried on from what a previous rendezvous process kept in the store.

Hosts and workers get a fresh heartbeat window to reconnect (their last heartbeats were on the
old process's clock), counted from when the slowest of them tries again at the latest
(`LONGEST_GAP_S`): one between two tries when this rendezvous began to serve is not silent, only
away. Without `agents_survive` (`ringmaster run`, whose emulated hosts died with it) every worker
is gone, so the job restarts from its checkpoint.
"""

from __future__ import annotations

from ringmaster.common.events import Kind
from ringmaster.common.reconnect import LONGEST_GAP_S
from ringmaster.rendezvous.control.drains import Drains
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.records import JobOutcome, JobWorkers, Phase, ResetCause, SavedJob
from ringmaster.rendezvous.control.worker_env import RANK_ENV_NAMES, base_env


def resume_job(job: Job, pool: HostPool, drains: Drains, saved: SavedJob, now: float, rendezvous_address: str,
               ring_store: str, agents_survive: bool = True) -> bool:
    """Take `saved` into `job` (`ring_store`: host:port of the rings' store). False when the
    saved job had ended already (it ends here too); True when the job must settle."""
    counters, settings = saved.counters, job.settings
    pool.resumed(saved.hosts, now, agents_survive)
    drains.resumed()
    job.workers, job.generation = JobWorkers(saved.workers), saved.generation
    job.next_id, job.hosts_sequence = counters.next_id, counters.hosts_sequence
    job.target_np, job.finishing = counters.target_np, counters.finishing
    summary = job.summary
    summary.generations, summary.resets, summary.steps = counters.generations, counters.resets, counters.steps
    summary.started_at = now
    job.generation_started = now - settings.crash_loop_window_s  # not a quick failure
    for worker in job.workers.values():
        worker.ready_at = now
        worker.last_heartbeat = now + LONGEST_GAP_S
        # The store is data: a worker's environment is this job's own (its settings, this
        # rendezvous and ring store), with only its place in the ring taken from the record.
        place = {name: value for name, value in worker.env.items() if name in RANK_ENV_NAMES}
        worker.env = {**base_env(worker.worker_id, worker.host, worker.slot, rendezvous_address, ring_store,
                                 settings), **place}
        if not agents_survive and worker.live:
            worker.move(Phase.EXITED)
    number = job.generation.number if job.generation else 0
    live = sum(1 for w in job.workers.values() if w.live)
    job.emit(now, Kind.JOB_RESUMED, number=number, live=live,
             hosts=sum(1 for h in pool.hosts.values() if h.agent_connected))
    if not agents_survive and job.generation is not None:
        job.causes.add("the previous rendezvous and its hosts ended", ResetCause.RESTART)
        job.end_generation("the previous `ringmaster run` ended with its workers", now)
    if counters.outcome is not None:
        job.end_job(JobOutcome(*counters.outcome), now)
        return False
    return True
