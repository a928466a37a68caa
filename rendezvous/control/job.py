"""One job's records, what each fact means for them, and the changes every decision about it
makes: a worker failed, a generation ended or formed, a worker retires, the job ends.

`Job` holds the workers, the current generation, the outcome, the summary and the counters the
store keeps, and the outbox of effects for the job's agents and workers. It uses the hosts of a
`HostPool` and never changes them except through it (a host blacklisted after a failure). The
coordinator calls these methods as it decides on inputs; `formation` uses them to form
generations. Pure: no I/O, the time is passed in.
"""

from __future__ import annotations

import logging
import signal
from typing import Callable, Iterable

from ringmaster.common.events import Event, Kind
from ringmaster.rendezvous.control.assignment import RankAssignment, order_keys
from ringmaster.rendezvous.control.census import Census, CensusKeeper
from ringmaster.rendezvous.control.effects import Assign, Effect, EndGeneration, EndJob, Retire, StopAgent
from ringmaster.rendezvous.control.facts import AgentConnected, AgentLost, SessionClosed, WorkerExited
from ringmaster.rendezvous.control.groups import whole_groups
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.plain_failures import command_failed, plain_failure
from ringmaster.rendezvous.control.policies import PLAIN, ExitMeaning, generation_policy, policy_of
from ringmaster.rendezvous.control.records import (
    Causes,
    Generation,
    JobCounters,
    JobOutcome,
    JobWorkers,
    Phase,
    ResetCause,
    Summary,
    Worker,
)
from ringmaster.settings import JobSettings


def describe_exit(exit_code: int, signal_number: int) -> str:
    if signal_number:
        try:
            name = signal.Signals(signal_number).name
        except ValueError:
            name = f"signal {signal_number}"
        return f"was killed by signal {signal_number} ({name})"
    return f"exited with code {exit_code}"



class Job:
    def __init__(self, settings: JobSettings, pool: HostPool, store_address: tuple[str, int],
                 on_event: Callable[[Event], None] | None = None) -> None:
        """`store_address`: where the rings' long-lived TCPStore listens (host, port)."""
        self.settings = settings
        self.pool = pool
        self.store_address = store_address
        self.on_event = on_event  # the server logs them; tests read `summary.events`
        self.workers: JobWorkers = JobWorkers()
        self.generation: Generation | None = None
        self.outcome: JobOutcome | None = None
        self.summary = Summary()
        self.finishing = False  # some worker's training function returned: no new generations
        self.target_np: int | None = None  # set by `ringmaster scale`; within [min_np, max_np]
        self.next_id = 1  # worker ids are host/N with N never reused in a job
        self.hosts_sequence = 0
        self.causes = Causes()
        self.fault_at: float | None = None  # when the failure not yet recovered from was seen
        self.fault_generation = 0  # the generation it broke
        self.generation_started = 0.0
        self.generation_formed_at = 0.0  # when the current generation formed (the last reset)
        self.quick_failures = 0  # consecutive generations that failed soon after forming, without progress
        self.steps_at_start = 0  # the job's committed steps when the current generation formed
        self.exit_awaited: dict[str, float] = {}  # worker id -> when its connection closed
        self.plain_failures = 0  # workers of a plain job that failed by themselves (each costs a restart)
        self.outbox: list[Effect] = []  # what the server delivers after each call
        self.last_commit_at = 0.0  # when rank 0's commit count last went up
        self.checkpoint_at_update = False  # the next host update asks rank 0 to make its commit durable (a drain)
        self._census = CensusKeeper(lambda: (self.workers, self.generation))

    # ------------------------------------------------------------------ reading
    @property
    def limit(self) -> int | None:
        """The most workers the job may have now: --max-np, or the scale target if lower (whole
        groups of --group-size: a target restored from an older store may be another number)."""
        caps = [c for c in (self.settings.max_np, self.target_np) if c is not None]
        return whole_groups(min(caps), self.settings.group_size) if caps else None

    def census(self) -> Census:
        """The workers as a pass asks about them (`census`): lists shared until a record changes."""
        return self._census.now()

    def live_workers(self) -> list[Worker]:
        """(Shared with the census: read it, do not change it.)"""
        return self._census.now().live

    def workers_on(self, host: str) -> list[Worker]:
        return self.workers.on(host)

    def busy_hosts(self) -> frozenset[str]:
        """Hosts that run a live worker of the job."""
        return self._census.now().busy_hosts

    def is_member(self, worker: Worker) -> bool:
        gen = self.generation
        return gen is not None and worker.worker_id in gen.member_set

    def capacity(self, now: float) -> int:
        """The workers the job can run now: its hosts' slots up to its limit, in whole groups."""
        return whole_groups(self.pool.capacity(now, self.limit), self.settings.group_size)

    def counters(self) -> JobCounters:
        return JobCounters(next_id=self.next_id, hosts_sequence=self.hosts_sequence, target_np=self.target_np,
                           finishing=self.finishing, generations=self.summary.generations, resets=self.summary.resets,
                           steps=self.summary.steps,
                           outcome=(self.outcome.success, self.outcome.message) if self.outcome else None)

    def awaiting_exits(self, now: float) -> set[str]:
        """Hosts of failed workers whose exit status has not come yet (bounded by
        `exit_report_timeout_s`): the next ring waits for it to know whether the host is blacklisted."""
        hosts = set()
        for worker_id, since in list(self.exit_awaited.items()):
            worker = self.workers.get(worker_id)
            host = self.pool.hosts.get(worker.host) if worker else None
            if worker is None or host is None or not host.agent_connected or worker.phase is Phase.EXITED \
                    or now - since >= self.settings.exit_report_timeout_s:
                del self.exit_awaited[worker_id]
            else:
                hosts.add(worker.host)
        return hosts

    # ------------------------------------------------------------------ telling
    def emit(self, now: float, kind: Kind, **fields: object) -> Event:
        """Record one event of the job (the status API keeps the newest) and hand it on."""
        event = Event(kind, fields, self.generation.number if self.generation else 0, now)
        if event.level > logging.DEBUG:
            self.summary.add_event(event)
        if self.on_event is not None:
            self.on_event(event)
        return event

    # ------------------------------------------------------------------ progress
    def note_commits(self, worker: Worker, commits: int, now: float) -> None:
        """Commits are counted by the state (they go back on a rollback); rank 0's count is the job's.
        Rank 0's first commit in a generation formed after a failure ends the recovery from it."""
        worker.commits = commits
        if commits and not worker.holds_commit:
            worker.holds_commit = True
        gen = self.generation
        if gen is not None and gen.members and gen.members[0].worker_id == worker.worker_id:
            if commits > self.summary.steps:
                self.last_commit_at = now
            self.summary.steps = commits
            if self.fault_at is not None and gen.number > self.fault_generation and commits > self.steps_at_start:
                self.emit(now, Kind.JOB_RECOVERED, seconds=now - self.fault_at, number=gen.number)
                self.fault_at = None

    def note_lost_commits(self, now: float) -> None:
        """No worker that holds the job's last commit is left. With --checkpoint-dir the next
        ring resumes from the newest checkpoint; without, the committed steps are gone: say so."""
        if self.summary.steps and not self.settings.checkpoint_dir:
            self.summary.warnings.append(self.emit(now, Kind.COMMITS_LOST, steps=self.summary.steps).message)
            self.summary.steps_lost += self.summary.steps
            self.summary.steps = 0

    # ------------------------------------------------------------------ what facts mean for the job
    def on_agent_connected(self, fact: AgentConnected, now: float) -> None:
        """A (re)connected agent's workers that it does not run died while it was away."""
        job, host = self, fact.host
        for worker in job.workers_on(host):
            if worker.live and worker.phase is not Phase.SPAWNING and worker.worker_id not in fact.running:
                worker.move(Phase.EXITED)
                if job.is_member(worker) and not worker.done:
                    job.end_generation(f"member {worker.worker_id} is gone: the agent of {host} does not run it", now)
                if not worker.done:
                    job.worker_failed(worker, f"its process is gone: the agent of {host} does not run it", now,
                                      blame_host=False, host_lost=False)

    def on_agent_lost(self, fact: AgentLost, now: float) -> None:
        """A host that left the job said goodbye; any other lost agent is a lost host."""
        job, host, reason = self, fact.host, fact.reason
        record = self.pool.hosts.get(host)
        # If its session is still open (a missed heartbeat), tell it to stop its workers.
        job.outbox.append(StopAgent(host, f"host {host} counted as lost: {reason}"))
        if job.outcome is not None or record is None:
            return
        drained = record.drain is not None
        # A host on its way out whose workers all left or are retiring (a retired worker's exit
        # report may come after its agent closed, or never) left: it was not lost.
        if (not record.discovered or drained) and not any(w.live and not w.stopping for w in job.workers_on(host)):
            for worker in job.workers_on(host):
                if worker.live:  # retiring: gone with its agent
                    worker.move(Phase.EXITED)
                    if job.is_member(worker) and not worker.done:
                        job.end_generation(f"member {worker.worker_id} left with its host {host}", now)
            job.emit(now, Kind.HOST_LEFT, host=host)
            return
        job.emit(now, Kind.HOST_LOST, host=host, reason=reason)
        job.causes.add(f"host {host} lost", ResetCause.PARTITION if fact.silent else ResetCause.HOST_LOST)
        for worker in job.workers_on(host):
            if worker.live and not worker.stopping and not worker.done:
                job.worker_failed(worker, f"its host {host} was lost", now, blame_host=False, host_lost=True)
            worker.move(Phase.EXITED)
        if not drained:  # a host being drained was on its way out: its loss is no fault of its own
            job.blacklist_host(host, f"its agent {reason}", now, by_itself=False)

    def on_worker_exited(self, fact: WorkerExited, now: float) -> None:
        """What the exit means (the job's policy), then what follows from it."""
        job = self
        host, worker_id, exit_code, signal_number = fact.host, fact.worker_id, fact.exit_code, fact.signal
        worker = job.workers.get(worker_id)
        if worker is None or worker.phase is Phase.EXITED:
            return
        how = describe_exit(exit_code, signal_number)
        was_live, member = worker.live, job.is_member(worker)
        worker.move(Phase.EXITED)
        verdict = policy_of(worker).exit_verdict(worker, exit_code, signal_number, fact.stopped_by_agent, was_live,
                                                 member)
        if verdict.meaning is ExitMeaning.FAILED and not worker.stopping and policy_of(worker) is PLAIN:
            if self._plain():
                # first: what follows is no news once the job failed
                self._plain_failure(worker, how, fact.output, exit_code, now)
            elif not worker.registered and fact.output and exit_code != 0 and signal_number == 0:
                self.fail(command_failed(worker, how, fact.output, self.settings.command), now)
        if member and verdict.meaning is not ExitMeaning.FINISHED:
            # Whatever the reason (even a stop we asked for), the ring cannot complete without it.
            job.end_generation(f"member {worker_id} on {host} {how}", now)
        exit_fields = {"worker": worker_id, "host": host, "how": how, "exit_code": exit_code, "signal": signal_number}
        if verdict.meaning is ExitMeaning.STOPPED:
            job.emit(now, Kind.WORKER_STOPPED, **exit_fields)
        elif verdict.meaning is ExitMeaning.FINISHED:
            worker.done = True
            job.emit(now, Kind.WORKER_FINISHED, **exit_fields)
            job.start_finishing(now)
        else:
            job.emit(now, Kind.WORKER_EXITED, **exit_fields)
            if was_live:
                job.worker_failed(worker, how, now, blame_host=False, host_lost=False)
            if verdict.blacklist:
                job.blacklist_host(host, f"worker {worker_id} {how}", now, by_itself=verdict.by_itself)

    def on_session_closed(self, fact: SessionClosed, now: float) -> bool:
        """A worker's session closed; True when that counts as its failure (decided on at once)."""
        job = self
        worker = job.workers.get(fact.worker_id)
        if worker is None or not worker.live or worker.stopping or worker.done:
            return False
        if not policy_of(worker).closed_connection_is_failure():
            return False  # outside hvd.elastic.run an exit may be success: its agent reports the code
        # An elastic worker that did not return from its training function died. Its exit code
        # follows (a crashing interpreter takes up to a second to exit); the next ring waits for
        # it, so that a blacklisted host is left out at once: one failure, one reset (Horovod too
        # waits for every worker's status).
        job.worker_failed(worker, "its connection to the rendezvous closed", now, blame_host=False, host_lost=False)
        job.exit_awaited[fact.worker_id] = now
        return True

    def _plain(self) -> bool:
        """Is this a plain job: launched so (`JobSettings.elastic`), and its generation's members
        never entered `hvd.elastic.run`?"""
        gen = self.generation
        return (gen is not None and not self.settings.elastic
                and generation_policy([self.workers[i] for i in gen.member_ids], False) is PLAIN)

    def _plain_failure(self, worker: Worker, how: str, output: str, exit_code: int, now: float) -> None:
        """A worker of a plain job failed (`plain_failures`): the job restarts, or fails."""
        self.plain_failures += 1
        failed = plain_failure(worker, how, output, exit_code, self.plain_failures, self.settings.max_restarts,
                               self.finishing, self.settings.command)
        if failed is not None:
            self.fail(failed, now)

    def members_start_later(self, gen: Generation) -> bool:
        """Do members of `gen` that have not connected yet go on starting when it fails, to join a
        later generation? In a job launched elastic whose script connects (some member did: a
        Ringmaster script). A plain script never connects: its members restart with the rest, as
        torchrun restarts every worker of an elastic (`--nnodes MIN:MAX`) job."""
        return self.settings.elastic and any(self.workers[i].registered for i in gen.member_ids)

    # ------------------------------------------------------------------ failures
    def blacklist_host(self, host: str, why: str, now: float, by_itself: bool) -> None:
        """Horovod's rule: the host of a failed worker is blacklisted. An elastic worker that
        exited by itself with an error is the script's doing, blacklisted whatever is left. A worker killed
        by a signal (OOM killer, preemption, kill -9) or a lost host is spared when the job
        would otherwise fall below --min-np (`--spare-last-hosts`, the default): the job then
        restarts there from its last commit or checkpoint instead of failing. A host whose other
        workers alone hold the job's last commit is never blacklisted: losing the committed
        steps costs more than keeping a host that failed once."""
        pool = self.pool
        if pool.is_blacklisted(host, now) or self.finishing or self.outcome is not None:
            return
        holders = self._sole_holders_of_commit(host)
        if holders:
            self.emit(now, Kind.HOST_KEPT_FOR_COMMIT, host=host, why=why, workers=holders)
            return
        record = pool.hosts.get(host)
        if (not by_itself and self.settings.spare_last_hosts and record is not None and record.discovered
                and not pool.has_slots_besides(host, self.settings.min_np, now)):
            self.emit(now, Kind.HOST_SPARED, host=host, min_np=self.settings.min_np)
            return
        reasons = pool.blacklist_host(host, why, now)
        if reasons is not None:
            self.fail(f"every host is blacklisted after failures ({reasons}): one or more processes exited with "
                      "non-zero status; fix the error the workers print above", now)

    def _sole_holders_of_commit(self, host: str) -> list[str]:
        """The live workers on `host` when they alone hold the job's last commit and workers
        elsewhere would carry on without it: every live worker on other hosts has reported no
        commit (newcomers whose sync has not reached them yet). Blacklisting the host would retire
        the holders, and the next ring would start from the newcomers' initial state. Empty when
        the job has no commit yet, others hold it too, or nobody else is left (then Horovod's rule
        and --spare-last-hosts decide, as for any last host)."""
        here = [w.worker_id for w in self.workers_on(host) if w.live and not w.stopping and w.holds_commit]
        if not here:
            return []
        others = False  # (one pass, ended by the first other holder: a lost host in a large job)
        for worker in self.workers.values():
            if worker.host != host and worker.live and not worker.stopping:
                if worker.holds_commit:
                    return []
                others = True
        return here if others else []

    def worker_failed(self, worker: Worker, reason: str, now: float, blame_host: bool, host_lost: bool) -> None:
        if worker.failed is not None or self.outcome is not None:
            return  # (once the job has ended, workers going away is its end, not news)
        worker.failed = reason
        self.emit(now, Kind.WORKER_FAILED, worker=worker.worker_id, host=worker.host, reason=reason)
        if self.fault_at is None and not worker.stopping:
            self.fault_at = now
            self.fault_generation = self.generation.number if self.generation is not None else 0
        if not host_lost:  # a lost host is its own cause
            self.causes.add(f"worker {worker.worker_id} on {worker.host} failed ({reason})", ResetCause.FAILURE)
        if self.is_member(worker):
            self.end_generation(f"worker {worker.worker_id} on {worker.host} failed: {reason}", now)
        if blame_host:
            self.blacklist_host(worker.host, f"worker {worker.worker_id} {reason}", now, by_itself=False)

    def end_generation(self, reason: str, now: float) -> None:
        gen = self.generation
        if gen is None or gen.over is not None or self.outcome is not None:
            return
        gen.over = reason
        self.causes.ensure(reason)
        self.emit(now, Kind.GENERATION_OVER, number=gen.number, reason=reason)
        # A generation that committed steps trained: however short it was, it is no crash loop.
        progressed = self.summary.steps > self.steps_at_start
        if now - self.generation_started < self.settings.crash_loop_window_s and not progressed:
            self.quick_failures += 1
        else:
            self.quick_failures = 0
        if self.quick_failures >= self.settings.crash_loop_limit:
            self.fail(
                f"{self.quick_failures} generations in a row failed within {self.settings.crash_loop_window_s:g} s "
                f"of forming without committing a step; the last: {reason}. Fix the error the workers print above",
                now,
            )
            return
        start_later = self.members_start_later(gen)  # (once: it looks at every member)
        for worker_id in gen.member_ids:
            worker = self.workers[worker_id]
            if not worker.live:
                continue
            if policy_of(worker).rejoins(worker):
                self.outbox.append(EndGeneration(worker_id, gen.number, reason, rejoin=worker.elastic))
            elif worker.phase is Phase.SPAWNING and start_later:
                # still starting: told when it connects, it joins a later generation (`Formation._generation_finished`)
                continue
            else:
                # A plain script cannot rejoin: restart it with the rest, as torchrun does.
                worker.stopping = True
                worker.stop_requested_at = now - self.settings.stop_grace_s

    # ------------------------------------------------------------------ generations
    def new_generation(self, members: list[RankAssignment], now: float) -> Generation:
        number = (self.generation.number if self.generation else 0) + 1
        cause, causes = self.causes.take(is_reset=self.generation is not None)
        last = self.generation
        order = order_keys(members, dict(zip(last.member_ids, last.order)) if last is not None else {})
        gen = Generation(number, members, cause, store_prefix=f"ringmaster/gen{number}/",
                         hosts_baseline=self.hosts_sequence,
                         order=order)
        if self.generation is not None:
            self.summary.resets += 1
        if now - self.generation_started >= self.settings.crash_loop_window_s:
            self.quick_failures = 0  # the last generation lived: no crash loop
        self.summary.generations += 1
        self.generation = gen
        self.generation_started = now
        self.generation_formed_at = now
        self.steps_at_start = self.summary.steps
        hosts: dict[str, int] = {}
        for a in members:
            hosts[a.host] = hosts.get(a.host, 0) + 1
        self.emit(now, Kind.GENERATION_FORMED, number=number, size=len(members), hosts=hosts, cause=cause,
                  causes=causes)
        return gen

    def send_assignment(self, worker: Worker) -> None:
        gen = self.generation
        assert gen is not None
        a = gen.by_worker[worker.worker_id]
        host, port = self.store_address
        self.outbox.append(Assign(a, gen.number, store_host=host, store_port=port, store_prefix=gen.store_prefix,
                                  hosts_sequence=gen.hosts_baseline))

    def exceeds_reset_limit(self, now: float) -> bool:
        limit = self.settings.reset_limit
        if limit is not None and self.summary.resets >= limit:
            self.fail(
                f"reset {self.summary.resets + 1} is needed but --reset-limit is {limit}; "
                "raise --reset-limit or fix what keeps failing (see the events above)",
                now,
            )
            return True
        return False

    # ------------------------------------------------------------------ leaving and ending
    def retire_all(self, leaving: Iterable[tuple[Worker, str]], now: float) -> None:
        """Retire each (worker, reason): the workers told alike (the same reason: a host's) hear
        it from one effect (`Retire.also`), in the order they were retired."""
        told: dict[str, list[str]] = {}
        for worker, reason in leaving:
            if worker.stopping:
                continue
            worker.stopping, worker.stop_requested_at = True, now
            self.emit(now, Kind.WORKER_RETIRING, worker=worker.worker_id, host=worker.host, reason=reason)
            if worker.registered:
                told.setdefault(reason, []).append(worker.worker_id)
        for reason, ids in told.items():
            self.outbox.append(Retire(ids[0], reason, also=tuple(ids[1:])))

    def start_finishing(self, now: float) -> None:
        if not self.finishing:
            self.finishing = True
            self.emit(now, Kind.JOB_FINISHING)

    def fail(self, message: str, now: float) -> None:
        self.end_job(JobOutcome(False, message), now)

    def end_job(self, outcome: JobOutcome, now: float) -> None:
        if self.outcome is not None:
            return
        self.outcome = outcome
        self.summary.ended_at = now
        kind = Kind.JOB_STOPPED if outcome.interrupted else Kind.JOB_SUCCEEDED if outcome.success else Kind.JOB_FAILED
        self.emit(now, kind, reason=outcome.message)
        for worker in self.live_workers():
            if worker.registered:
                self.outbox.append(EndJob(worker.worker_id, outcome.success, outcome.message))
