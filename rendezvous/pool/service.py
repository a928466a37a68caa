"""The pool service: hosts from one source, jobs from submissions, and every scheduling interval
the policy's verdicts carried out.

Each job runs as it would alone: its own `RendezvousServer` (own secret, generations, rings'
store, commits, checkpoints, events, metrics, control API) on this asyncio loop, its hosts the
pool's placement (`PlacementHosts`), its agents started on those hosts by the pool's launcher
with that job's secret only. A resize is a change of the placement, which the job carries out
at its next commit; taking a job whole is the preemption path (a durable checkpoint at the next
commit, then its workers stop) and starting it again resumes from that checkpoint. A host that
one job finds lost is taken out of the pool (for --blacklist-cooldown) and every job on it is
rescheduled at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import pathlib
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from ringmaster.common.errors import Refused
from ringmaster.common.events import Event, Kind
from ringmaster.common.logs import JOB_LABEL
from ringmaster.common.secret import generate_secret
from ringmaster.common.tls import ServerTls
from ringmaster.discovery import HostDiscovery
from ringmaster.launch.launch_plan import SshOptions
from ringmaster.launch.launchers import AgentOptions, Launcher
from ringmaster.rendezvous.control.records import JobOutcome
from ringmaster.rendezvous.control.view import NO_ROWS, JobView
from ringmaster.rendezvous.pool.board_launcher import BoardLauncher
from ringmaster.rendezvous.pool.host_board import DEFAULT_HOST_TIMEOUT_S, HostBoard
from ringmaster.rendezvous.pool.job_book import JobBook
from ringmaster.rendezvous.pool.job_measures import JobMeasures
from ringmaster.rendezvous.pool.placement_hosts import PlacementHosts
from ringmaster.rendezvous.pool.pool_hosts import PoolHosts
from ringmaster.rendezvous.pool.table import JobTable, PoolJob
from ringmaster.rendezvous.scheduling.model import Settings as Rules
from ringmaster.rendezvous.scheduling.plan import schedule
from ringmaster.rendezvous.server.app import RendezvousServer
from ringmaster.rendezvous.state.kv import KeyValueStore
from ringmaster.rendezvous.state.leadership import Leadership
from ringmaster.settings import DEFAULT_START_TIMEOUT_S, JobSettings

#: The most workers a job may ask for together where hosts join by connecting (known later).
MAX_GANG = 1_000_000
#: Seconds between two scheduling rounds when nothing wakes the pool earlier.
SCHEDULE_INTERVAL_S = 0.5


@dataclass
class _Lease:
    """A job that runs: its rendezvous, the hosts it reads, the task that runs it."""

    server: RendezvousServer
    hosts: PlacementHosts
    task: asyncio.Task[JobOutcome]


class PoolService:
    """The pool: its hosts (`PoolHosts`), its jobs (`JobTable`, kept by `JobBook`), what they
    measured (`JobMeasures`), and the leases of the running ones, resized by the policy's verdicts."""

    def __init__(self, source: HostDiscovery, policy: str, rules: Rules, job_settings: Mapping[str, object],
                 checkpoint_root: pathlib.Path, say: Callable[..., None], launcher: str = "local",
                 ssh: SshOptions = SshOptions(), bind: str = "127.0.0.1", advertise: str | None = None,
                 discovery_interval_s: float = 1.0, blacklist_cooldown_s: float = 300.0,
                 store: KeyValueStore | None = None, leadership: Leadership | None = None, prefix: str = "",
                 board: HostBoard | None = None, join_secret: str | None = None, tls: ServerTls | None = None,
                 host_timeout_s: float = DEFAULT_HOST_TIMEOUT_S) -> None:
        """`job_settings`: JobSettings fields every job gets (spares, grace periods...); `say(kind,
        **fields)` tells the pool's events. With a `store` (led through `leadership`), the jobs
        are kept under `prefix` and taken up again by the next pool that leads it.

        The hosts (`pool_hosts`): with `board` given (`--hosts-from-agents`) the source is that
        board, hosts join by connecting; otherwise `source` (-H, a discovery script) names them
        and `launcher` starts a pool agent on each, proving a key derived from `join_secret`."""
        self.tls = tls  # every job's rendezvous serves with it (None: plain)
        self.policy = policy
        self.rules = rules
        self.measures = JobMeasures()
        self.job_settings = dict(job_settings)
        #: What the pool does with a straggler a job reports (--stragglers): "replace" takes the
        #: host out for the cooldown, so the job is placed on another host at its next commit.
        self.stragglers = str(self.job_settings.pop("stragglers", "report"))
        self.checkpoint_root = checkpoint_root
        self.say = say
        self.launcher = launcher
        self.ssh = ssh
        self.bind = bind
        self.advertise = advertise
        self.table = JobTable(set(rules.queue_weights))
        self.leases: dict[str, _Lease] = {}
        self.changed = asyncio.Event()
        self.pool_hosts = PoolHosts(
            source, board if board is not None else HostBoard(host_timeout_s), board is not None, say, self.changed,
            self._host_taken_out,
            float(self.job_settings.get("start_timeout_s", DEFAULT_START_TIMEOUT_S)),  # type: ignore[arg-type]
            launcher, ssh, join_secret, discovery_interval_s, blacklist_cooldown_s)
        self.book = JobBook(self.table, store, leadership, prefix, say)
        self.leadership = leadership
        self._stop = False
        self.deposed: str | None = None
        self._finished = False

    # ---------------------------------------------------------------- what the API asks
    def submit(self, command: list[str], min_np: int, max_np: int | None, name: str | None, queue: str,
               priority: int, demand: Mapping[str, float] | None = None, group_size: int = 1) -> PoolJob:
        hosts = self.pool_hosts
        if command and self.launcher == "local" and not hosts.joining and command[0] not in ("python", "python3") \
                and shutil.which(command[0]) is None:
            raise Refused(f"command {command[0][:200]!r} is not found on this machine, where the pool's hosts run it: "
                          "give its path, or install it")
        now = time.time()
        # Hosts that join by connecting come and go: a job may be queued before they are there;
        # named hosts are judged once their pool agents have said what they have.
        capacity = max(hosts.capacity(now), sum(hosts.expected.values())) if not hosts.joining else MAX_GANG
        totals = hosts.resource_totals() if not hosts.joining and hosts.every_host_joined() else None
        job = self.table.submit(command, min_np, max_np, now, capacity, name, queue, priority,
                                taken=lambda job_id: (self.checkpoint_root / job_id).exists(), demand=demand,
                                totals=totals, group_size=group_size)
        self.book.dirty.add(job.id)
        self.say(Kind.POOL_JOB_SUBMITTED, job=job.id, queue=job.queue, priority=job.priority, min_np=job.min_np,
                 max_np=job.max_np)
        self.changed.set()
        return job

    def cancel(self, job_id: str) -> PoolJob:
        job = self.table.cancel(job_id, time.time())
        self.book.dirty.add(job.id)
        lease = self.leases.get(job_id)
        if job.state == "cancelling" and lease is not None:
            lease.server.request_stop("cancelled through the pool")
        elif job.state == "cancelled":
            self.say(Kind.POOL_JOB_ENDED, job=job.id, state=job.state, outcome=job.message)
        self.changed.set()
        return job

    def scale(self, job_id: str, np: int) -> PoolJob:
        declared = self.measures.global_batch(job_id, self._server(job_id))  # (what its script declared, up to date)
        if declared is not None and np > declared[2]:
            size, micro, most = declared
            raise Refused(f"-np {np}: job {job_id}'s global batch of {size} samples is {size // micro} micro-batches "
                          f"of {micro} per step, work for at most {most} workers; scale to at most {most}")
        job = self.table.scale(job_id, np)
        self.book.dirty.add(job.id)
        job.urgent = True  # asked for by its owner: not held by the interval between resizes
        self.changed.set()
        return job

    def server_of(self, job_id: str) -> RendezvousServer:
        """The rendezvous of a running job (`ringmaster status --job`); KeyError names why not."""
        job = self.table.get(job_id)
        lease = self.leases.get(job_id)
        if lease is None or lease.server.service is None:
            raise KeyError(f"job {job_id} is {job.state}: it has no rendezvous now ({job.reason})")
        return lease.server

    def view_of(self, job_id: str) -> tuple[JobView, float]:
        """The job as its rendezvous sees it now, or saw it last (its events outlive it, for
        `ringmaster logs`), with the wall-clock time of that view; KeyError names why there is none."""
        job = self.table.get(job_id)
        lease = self.leases.get(job_id)
        view = lease.server.view(NO_ROWS) if lease is not None else None
        if view is not None:
            return view, time.time()
        if job.last_view is None:
            raise KeyError(f"job {job_id} is {job.state} and has not run yet: no events ({job.reason})")
        return job.last_view, job.last_view_wall

    def measured(self, job_id: str) -> list[dict[str, float]]:
        """What `job_id` measured (its step time by size), for its row in the API."""
        return [{"hosts": m.hosts, "workers": m.workers, "steps": m.steps, "step_s": round(m.step_s, 6),
                 "compute_s": round(m.compute_s, 6)} for m in self.measures.step_times(job_id, self._server(job_id))]

    def stop(self) -> None:
        self._stop = True
        self.changed.set()

    @property
    def stopping(self) -> bool:
        """Whether every job has stopped and the pool is on its way out (held polls answer at once)."""
        return self._finished

    # ---------------------------------------------------------------- the loop
    async def run(self) -> None:
        """Take up the jobs the store kept, then poll the hosts, reap ended jobs, schedule and
        save, until `stop()` (or another pool leads); then stop every job."""
        await self.take_up()
        if self.policy == "goodput":  # its first fit would import scipy.optimize on this loop, for seconds
            await asyncio.to_thread(importlib.import_module, "scipy.optimize")
        self.pool_hosts.start_agents()
        background = [asyncio.create_task(self.pool_hosts.poll(lambda: self._stop)),
                      asyncio.create_task(self.pool_hosts.watch_own_stalls())]
        if self.leadership is not None:
            background.append(asyncio.create_task(self.leadership.keep(lambda trouble: None)))
        try:
            while not self._stop:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), SCHEDULE_INTERVAL_S)
                self.changed.clear()
                if self.leadership is not None and self.leadership.lost.is_set():
                    self.deposed = self.leadership.lost_reason or "another pool leads"
                    break
                self._reap()
                if not self._stop:
                    self._schedule(time.time())
                await self._save()
        finally:
            for task in background:
                task.cancel()
            for lease in self.leases.values():
                lease.server.request_stop("the pool is stopping")
            if self.leases:
                await asyncio.gather(*(lease.task for lease in self.leases.values()), return_exceptions=True)
            await self.pool_hosts.stop_agents()
            self._finished = True

    async def take_up(self, expected: Mapping[str, int] | None = None) -> None:
        """The jobs a store kept (`JobBook`). `expected`: the hosts the source named when the pool
        started. Done before the API serves (else a submission in between would be judged
        against no hosts and could take a kept job's id); once."""
        if self.book.taken_up:
            return
        if expected is not None:
            self.pool_hosts.named(dict(expected), time.time())
        await self.book.take_up()

    async def _save(self) -> None:
        deposed = await self.book.save()
        if deposed is not None:
            self.deposed = deposed
            self._stop = True

    def _reap(self) -> None:
        for job_id, lease in list(self.leases.items()):
            if not lease.task.done():
                continue
            del self.leases[job_id]
            job = self.table.jobs.get(job_id)
            if job is None:
                continue
            last = lease.server.view(NO_ROWS)  # (its events, for `ringmaster logs`)
            if last is not None:
                job.last_view, job.last_view_wall = last, time.time()
            try:
                outcome = lease.task.result()
            except Exception as exc:  # the job could not run at all (its rendezvous failed to start)
                outcome = JobOutcome(False, f"its rendezvous failed: {exc}")
            now = time.time()
            self.book.dirty.add(job.id)
            if job.state == "cancelling":
                self.table.end(job, "cancelled", "cancelled while it ran", now)
            elif outcome.preempted:
                job.state, job.placement, job.reason = "suspended", {}, "suspended: resumes from its checkpoint"
                job.sized(now)
            elif outcome.success:
                self.table.end(job, "succeeded", outcome.message, now)
            else:
                self.table.end(job, "failed", outcome.message, now)
            self.say(Kind.POOL_JOB_ENDED if job.state != "suspended" else Kind.POOL_JOB_SUSPENDED, job=job.id,
                     state=job.state, outcome=outcome.message)

    def _schedule(self, now: float) -> None:
        missing = self.pool_hosts.gathering(now)
        if missing:
            for job in self.table.live():
                job.reason = ("waiting for the pool's host(s) "
                              f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} to join (at most "
                              "--start-timeout after the pool named them)")
            return
        usable = self.pool_hosts.usable_hosts(now)
        for job in self.table.live():  # slots of jobs on their way out are not the policy's to give
            if job.state in ("suspending", "cancelling"):
                for host, n in job.placement.items():
                    if host in usable:
                        usable[host] -= n
        usable = {h: n for h, n in usable.items() if n > 0}
        jobs = [j for j in self.table.live() if j.state in ("queued", "running", "suspended")]
        self.measures.forget_all_but(j.id for j in self.table.live())
        asks = [j.ask(now, self.measures.scaling(j.id, self._server(j.id)) if self.policy == "goodput" else None,
                      self.pool_hosts.start_timeout_s) for j in jobs]
        verdicts = schedule(self.policy, usable, asks, now, self.rules, self._free_resources(usable))
        grows = []
        for job in jobs:  # first what running jobs give back (at their next commit) ...
            verdict = verdicts[job.id]
            job.reason = verdict.reason + (self.pool_hosts.blacklisted_note(now) if not verdict.placement else "")
            placement = dict(verdict.placement)
            if job.state in ("queued", "suspended"):
                if placement:
                    grows.append((job, placement))
            elif not placement:
                self._suspend(job, verdict.reason, now)
            elif placement == job.placement:
                continue
            elif all(n <= job.placement.get(h, 0) for h, n in placement.items()):
                self._resize(job, placement, now)
            else:
                grows.append((job, placement))
        leaving = self._leaving()
        for job, placement in grows:  # ... then starts and growth, on slots nobody's workers still hold
            mine = job.placement if job.state == "running" else {}
            busy = sorted(h for h, n in placement.items() if n > mine.get(h, 0) and leaving.get(h))
            if busy:
                job.reason = (f"takes {sum(placement.values())} slot(s) once the workers leaving {', '.join(busy)} "
                              "have gone (at their job's next commit)")
            elif job.state == "running":
                self._resize(job, placement, now)
            else:
                self._start(job, placement, now)

    def _server(self, job_id: str) -> RendezvousServer | None:
        lease = self.leases.get(job_id)
        return lease.server if lease is not None else None

    def _free_resources(self, usable: Mapping[str, int]) -> dict[str, dict[str, float]]:
        """Each usable host's resources less what the workers of jobs on their way out take."""
        free = {h: dict(r) for h, r in self.pool_hosts.resources().items() if h in usable}
        for job in self.table.live():
            if job.state in ("suspending", "cancelling"):
                for host, n in job.placement.items():
                    for name, amount in job.demand.items():
                        if host in free and name in free[host]:
                            free[host][name] = max(0.0, free[host][name] - amount * n)
        return free

    def _leaving(self) -> dict[str, int]:
        """Per host, live workers of running jobs beyond what their placement gives them there:
        workers on their way out at their next commit, whose slots are not free yet (a GPU two
        jobs' workers shared would run out of memory)."""
        held: dict[str, int] = {}
        for job_id, lease in self.leases.items():
            job = self.table.jobs.get(job_id)
            view = lease.server.view() if job is not None else None
            if view is None or job is None:
                continue
            keeps = job.placement if job.state == "running" else {}  # a job suspending or cancelling keeps none
            on: dict[str, int] = {}
            for worker in view.workers:
                if worker.live:
                    on[worker.host] = on.get(worker.host, 0) + 1
            for host, count in on.items():
                if count > keeps.get(host, 0):
                    held[host] = held.get(host, 0) + count - keeps.get(host, 0)
        return held

    # ---------------------------------------------------------------- acting
    def _start(self, job: PoolJob, placement: dict[str, int], now: float) -> None:
        resuming = job.state == "suspended"
        command = [sys.executable, *job.command[1:]] if job.command[0] in ("python", "python3") else job.command
        settings = JobSettings(command=command, min_np=job.min_np, max_np=job.max_np, elastic=True,  # (resized at will)
                               group_size=job.group_size,
                               checkpoint_dir=str(self.checkpoint_root / job.id),
                               **self.job_settings)  # type: ignore[arg-type]
        hosts = PlacementHosts(placement)
        board = self.pool_hosts.board

        def launcher(options: AgentOptions, secret: str | None) -> Launcher:
            return BoardLauncher(board, job.id, options, secret, job.demand.get("gpu", 0.0))

        server = RendezvousServer(settings, hosts, bind=self.bind, port=0, api_port=0, local_hosts=True,
                                  launcher=launcher, ssh=self.ssh, advertise=self.advertise,
                                  secret=generate_secret(), tls=self.tls,
                                  observe=lambda event: self._job_event(job.id, event))
        label = JOB_LABEL.set(job.id)
        try:  # the task (and every task it starts) logs with the job's label
            task = asyncio.create_task(server.run(placement), name=f"job {job.id}")
        finally:
            JOB_LABEL.reset(label)
        task.add_done_callback(lambda _: self.changed.set())
        self.leases[job.id] = _Lease(server, hosts, task)
        self.book.dirty.add(job.id)
        job.state, job.placement, job.resized_at, job.urgent, job.settled = "running", placement, now, False, False
        job.started_at = job.started_at or now
        job.resumes += resuming
        job.sized(now)
        self.say(Kind.POOL_JOB_STARTED, job=job.id, size=job.size, hosts=_hosts(placement),
                 how="resumes from its checkpoint" if resuming else "starts")

    def _resize(self, job: PoolJob, placement: dict[str, int], now: float) -> None:
        lease = self.leases[job.id]
        before = job.size
        lease.hosts.set(placement)
        if lease.server.service is not None:
            lease.server.service.hosts_found(dict(placement))
        job.placement, job.resized_at, job.urgent, job.settled = placement, now, False, False
        job.sized(now)
        self.book.dirty.add(job.id)
        self.say(Kind.POOL_JOB_RESIZED, job=job.id, before=before, size=job.size, hosts=_hosts(placement),
                 reason=job.reason)

    def _suspend(self, job: PoolJob, reason: str, now: float) -> None:
        self.leases[job.id].server.request_preemption(f"the pool takes its slots: {reason}")
        job.state = "suspending"
        self.book.dirty.add(job.id)
        job.reason = "suspending: a durable checkpoint at its next commit, then its workers stop"
        self.say(Kind.POOL_JOB_SUSPENDING, job=job.id, reason=reason)

    def _job_event(self, job_id: str, event: Event) -> None:
        """A job's event: a host it lost (or, with --stragglers replace, found slow) is out of the
        pool for the cooldown; a worker that left may free a slot another job waits for (the next
        round at once); a generation formed on its placement is the resize taken (the interval
        between resizes counts from then)."""
        if event.kind in (Kind.WORKER_STOPPED, Kind.WORKER_EXITED, Kind.WORKER_FINISHED):
            self.changed.set()
        if event.kind is Kind.GENERATION_FORMED and isinstance(event.fields.get("hosts"), dict):
            job = self.table.jobs.get(job_id)
            if job is not None:
                job.formed(event.fields["hosts"], time.time())
        lost = event.kind is Kind.HOST_LOST
        slow = event.kind is Kind.STRAGGLER_FOUND and self.stragglers == "replace"
        if lost or slow:
            host = str(event.fields.get("host", ""))
            if self.pool_hosts.in_pool(host, time.time()):
                why = "was lost" if lost else f"is a straggler ({float(event.fields.get('slowdown', 0)):.2f}x slower)"
                self.say(Kind.POOL_HOST_BLACKLISTED, host=host, job=job_id,
                         cooldown_s=self.pool_hosts.blacklist_cooldown_s, why=why)
                self.pool_hosts.take_out(host, time.time())

    def _host_taken_out(self, host: str) -> None:
        """A host left the pool for its cooldown: every job on it is rescheduled at once (not held
        by the interval between resizes)."""
        for job in self.table.live():
            if host in job.placement:
                job.urgent = True


def _hosts(placement: Mapping[str, int]) -> str:
    return ",".join(f"{h}:{n}" for h, n in placement.items())

