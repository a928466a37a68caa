"""Drains: a host taken politely costs no committed work.

A drain takes a host out of the job without a failure: it stops being eligible (so nothing new
starts there), its workers that are members of the generation leave at their next commit, as
when discovery removes a host (the others go on without a rollback), and the host is not
blacklisted. It stays out until undrained (an operator's drain), until its notice is withdrawn,
or until another agent process connects for it (a drain its agent asked for: SIGTERM, a
preemption notice). A deadline bounds it: workers still there when it passes are stopped and
the job recovers as from a failure, from the last commit.

When the drain leaves fewer slots than --min-np (or no host at all), the update that sends the
workers off asks rank 0 to make that commit durable first (`Job.checkpoint_at_update`), so a
job that must wait for hosts, or is started again, resumes from it.

Pure: no I/O, the time is passed in.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ringmaster.common.errors import Refused
from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.effects import StopAgent
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.records import Drain, DrainSource, ResetCause, Worker

#: The longest deadline a drain may be given (a day): beyond it, a drain is a mistake.
MAX_DRAIN_DEADLINE_S = 86_400.0
#: The longest reason kept with a drain.
MAX_DRAIN_REASON = 200


def deadline_problem(deadline_s: object) -> str:
    """"" for a usable drain deadline (seconds); otherwise what is wrong with it."""
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)):
        return f"the deadline must be a number of seconds, got {deadline_s!r}"
    if not math.isfinite(deadline_s) or deadline_s <= 0:
        return f"the deadline must be a positive number of seconds, got {deadline_s!r}"
    if deadline_s > MAX_DRAIN_DEADLINE_S:
        return f"the deadline {deadline_s:g} s is longer than a day ({MAX_DRAIN_DEADLINE_S:g} s): give a shorter one"
    return ""


class Drains:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.pool = job.pool
        self._active: set[str] = set()  # hosts whose drain is not done: settling looks at these only
        #: host -> (seconds, optimizer steps) of uncommitted work lost when its deadline passed
        self._expired: dict[str, tuple[float, int]] = {}

    # ------------------------------------------------------------------ inputs
    def request(self, host: str, source: DrainSource, deadline_s: float, reason: str, now: float,
                incarnation: str = "") -> Drain:
        """Drain `host` within `deadline_s`; `Refused`, saying why, for an unknown host or a bad deadline."""
        record = self.pool.hosts.get(host)
        if record is None:
            known = ", ".join(sorted(self.pool.hosts)[:20]) or "none yet"
            raise Refused(f"no host {host[:100]!r} in this job (its hosts: {known})")
        problem = deadline_problem(deadline_s)
        if problem:
            raise Refused(f"drain of {host}: {problem}")
        if self.job.outcome is not None:
            raise Refused("the job has already ended")
        reason = reason[:MAX_DRAIN_REASON] or source.value
        deadline_at = now + deadline_s
        old = record.drain
        if old is not None:
            # Another request for a host already draining: the earlier deadline holds, and an
            # operator's drain outlasts the agent's reasons.
            deadline_at = min(deadline_at, old.deadline_at) if not old.done else deadline_at
            if old.source is DrainSource.OPERATOR:
                source, incarnation = old.source, old.incarnation
        busy = any(w.live for w in self.job.workers_on(host))
        if old is not None and not old.done:
            drain = Drain(source, reason, old.requested_at, deadline_at, incarnation, had_workers=old.had_workers)
        else:
            drain = Drain(source, reason, now, deadline_at, incarnation, had_workers=busy,
                          done=not busy and old is not None)
            self._expired.pop(host, None)
        record.drain = drain
        if not drain.done:
            self._active.add(host)
        self.job.emit(now, Kind.HOST_DRAINING, host=host, why=reason, source=source.value,
                      deadline_s=max(0.0, deadline_at - now))
        if busy:
            self.job.causes.add(f"host {host} drained ({reason})", ResetCause.HOST_REMOVED)
            if self.job.capacity(now) < self.job.settings.min_np or not self.pool.eligible_hosts(now):
                self.job.checkpoint_at_update = True  # the job must wait for hosts: keep this commit
        return drain

    def withdraw(self, host: str, source: DrainSource, now: float, why: str) -> bool:
        """End the drain of `host` (`Refused` if it has none). A notice withdrawn leaves an
        operator's drain in place (False)."""
        record = self.pool.hosts.get(host)
        if record is None:
            raise Refused(f"no host {host[:100]!r} in this job")
        drain = record.drain
        if drain is None:
            raise Refused(f"host {host} is not being drained")
        if source is not DrainSource.OPERATOR and drain.source is DrainSource.OPERATOR:
            return False
        self._end(host, now, why)
        return True

    def agent_connected(self, host: str, incarnation: str, now: float) -> None:
        """Another agent process for `host`: a drain the last one asked for ends with it."""
        record = self.pool.hosts.get(host)
        if record is None or record.drain is None or record.drain.source is DrainSource.OPERATOR:
            return
        if incarnation and record.drain.incarnation and incarnation != record.drain.incarnation:
            self._end(host, now, "a new agent connected for it")

    def _end(self, host: str, now: float, why: str) -> None:
        self.pool.hosts[host].drain = None
        self._active.discard(host)
        self._expired.pop(host, None)
        self.job.emit(now, Kind.HOST_UNDRAINED, host=host, why=why)
        self.job.causes.add(f"host {host} undrained", ResetCause.HOST_ADDED)

    # ------------------------------------------------------------------ the clock
    def settle(self, now: float, finish: bool = True) -> None:
        """Stop the workers of drains past their deadline; with `finish`, end the drains whose
        hosts run none of the job's workers any more."""
        job = self.job
        if job.outcome is not None:
            return
        for name in sorted(self._active):
            record = self.pool.hosts.get(name)
            drain = record.drain if record is not None else None
            if record is None or drain is None or drain.done:
                self._active.discard(name)
                continue
            live = [w for w in job.workers_on(record.name) if w.live]
            if not live:
                if finish:
                    self._finished(record.name, drain, now)
            elif now >= drain.deadline_at and record.name not in self._expired:  # (stopped once)
                self._expire(record.name, live, now)

    def resumed(self) -> None:
        """Watch again the drains a previous rendezvous left under way (`HostPool.resumed`)."""
        self._active = {name for name, host in self.pool.hosts.items()
                        if host.drain is not None and not host.drain.done}

    def _finished(self, host: str, drain: Drain, now: float) -> None:
        self.pool.hosts[host].drain = replace(drain, done=True)  # (a new object: the host's record is rewritten)
        self._active.discard(host)
        seconds = now - drain.requested_at
        lost = self._expired.get(host)
        lost_s, lost_steps = lost if lost is not None else (0.0, 0)
        if lost is not None:
            outcome = "deadline"
            how = (f"its deadline passed before its workers reached a commit: they were stopped and the others "
                   f"rolled back to their last commit ({lost_steps} step(s), {lost_s:.1f} s of work since it)")
        elif drain.had_workers:
            outcome, how = "commit", "its workers left at a commit, nothing rolled back"
        else:
            outcome, how = "idle", "it ran no workers of the job"
        self.job.emit(now, Kind.HOST_DRAINED, host=host, seconds=seconds, how=how, outcome=outcome,
                      uncommitted_s=lost_s, steps_lost=lost_steps)
        drains = self.job.summary.drains
        drains[outcome] = drains.get(outcome, 0) + 1
        if drain.source is DrainSource.SIGNAL:
            # The agent asked to go: it may exit now (exit 0), its host gone from the job.
            self.job.outbox.append(StopAgent(host, f"host {host} drained"))

    def _expire(self, host: str, live: list[Worker], now: float) -> None:
        """The deadline passed with workers still there: stop them; the others recover from
        their last commit (the work since it is what the deadline cost)."""
        job = self.job
        # Steps as the members' last heartbeats counted them (a heartbeat's interval may hide a few more).
        steps = max((w.steps_since_commit for w in job.workers.values() if w.live and job.is_member(w)), default=0)
        self._expired[host] = (max(0.0, now - job.last_commit_at), steps)
        reason = f"host {host}'s drain deadline passed before its workers reached a commit"
        if any(job.is_member(w) for w in live):
            job.causes.add(reason, ResetCause.HOST_REMOVED)
            job.end_generation(reason, now)
        job.retire_all([(worker, reason) for worker in live], now)
