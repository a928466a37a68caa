"""The gRPC face of the rendezvous: turns RPCs into coordinator calls and its outbox into streams.

Runs on one asyncio loop, so the coordinator is only ever touched from that loop's thread and
needs no lock. Each agent and worker session owns an asyncio queue; a closed stream (the process
died, the host was lost) is reported to the coordinator at once, which is how a killed worker is
noticed in milliseconds rather than after a heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator, Callable

import grpc

from ringmaster.common.errors import Refused
from ringmaster.discovery import MAX_HOSTS, MAX_SLOTS_PER_HOST, host_name_problem
from ringmaster.launch.launchers import Launcher, NoLauncher
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.rendezvous.control.coordinator import Coordinator
from ringmaster.rendezvous.control.effects import (
    Effect,
)
from ringmaster.rendezvous.control.records import DrainSource, recorded_changes
from ringmaster.rendezvous.control.view import ALL_ROWS, JobView, Page
from ringmaster.rendezvous.server.beat_figures import BeatFigures
from ringmaster.rendezvous.server.carried_ready import take_carried
from ringmaster.rendezvous.server.heap import LongLivedHeap
from ringmaster.rendezvous.server.session_outbox import SessionOutbox
from ringmaster.rendezvous.state.agent_leases import AgentLeases
from ringmaster.rendezvous.state.journal import Journal

Clock = Callable[[], float]
#: Agent sessions kept at most for hosts that discovery does not list: an agent may connect
#: before its host is listed (it waits), but sessions for invented hosts must not pile up.
MAX_UNLISTED_AGENTS = 64
#: The most of an agent's version string kept (a PEP 440 version with its local part is far shorter).
MAX_VERSION_CHARS = 80
#: Put in a session's queue to end its stream quietly (its agent opened a new session).
_REPLACED = object()


#: Most seconds the first input after a quiet while waits for others to be decided on with it
#: (a lost host's agent and worker sessions close within milliseconds of each other).
GATHER_S = 0.1
#: Most worker beats an agent's heartbeat may carry (a host's workers: slots are far fewer), and
#: the oldest one taken (seconds): an agent keeps only beats newer than a worker's silence.
MAX_RELAYED_BEATS = MAX_SLOTS_PER_HOST
MAX_RELAYED_AGE_S = 3600.0
#: A save that releases no message waits for up to this many times a save's cost (a large job's
#: record takes milliseconds to build; its members' Readies at a host update come one by one).
QUIET_SAVE_DUTY = 10.0
#: Seconds after a generation formed that the heap is frozen, if its messages have gone out by
#: then (else it waits for them, looking again every HEAP_FREEZE_DELAY_S, up to HEAP_FREEZE_LATEST_S).
HEAP_FREEZE_DELAY_S = 2.0
HEAP_FREEZE_LATEST_S = 30.0


class RendezvousService(pb_grpc.RendezvousServicer):
    """With a `journal`, what the coordinator says is held back until the state behind it is
    in the store (write-ahead); with `leases`, agents' liveness is also kept as store leases."""

    def __init__(self, coordinator: Coordinator, clock: Clock = time.monotonic, journal: Journal | None = None,
                 leases: AgentLeases | None = None, launcher: Launcher | None = None) -> None:
        self.coordinator = coordinator
        self.clock = clock
        self.journal = journal
        self.leases = leases
        self.outbox = SessionOutbox(launcher or NoLauncher())
        self.changed = asyncio.Event()  # set after every coordinator call; the job loop watches it
        self._held: list[Effect] = []
        self._saved_marker: tuple = ()  # what the journal last saved was built at (see keep_journal)
        self._dirty = asyncio.Event()
        self._releasing = asyncio.Event()  # set when messages wait for a save (see keep_journal)
        self._save_cost = 0.0  # seconds the last save took to build
        self._tasks: set[asyncio.Task] = set()
        self._settle_scheduled = False
        self._settle_cost = 0.0  # seconds the last settling pass took
        self._settled_at = 0.0  # when it ended (time.perf_counter)
        self.beat_figures = BeatFigures()  # what heartbeats carry besides liveness
        self.beats = {"worker": 0, "agent": 0}  # workers' heartbeats taken, by who sent them (metrics)
        self.readies = {"worker": 0, "agent": 0}  # workers' `Ready`s taken, by who sent them (metrics)
        self.heap = LongLivedHeap()
        self._heap_generation = 0  # the last generation a freeze was planned for

    # ---------------------------------------------------------------- for the other readers and inputs
    def view(self, page: Page = ALL_ROWS) -> JobView:
        """The job as readers (the control API, the metrics, the progress line) see it now,
        listing the hosts and workers of `page`."""
        return self.coordinator.view(self.clock(), page)

    def scale_to(self, np: int) -> None:
        """Ask the job for `np` workers (`Refused` says why not)."""
        self.call(self.coordinator.scale, np)

    def drain_host(self, host: str, deadline_s: float) -> None:
        """An operator's drain of `host` (`Refused` says why not)."""
        self.call(lambda now: self.coordinator.drain_host(host, deadline_s, now))

    def undrain_host(self, host: str) -> None:
        """An operator takes `host` back (`Refused` if it is not drained)."""
        self.call(lambda now: self.coordinator.undrain_host(host, now))

    def hosts_found(self, hosts: dict[str, int]) -> None:
        """Discovery's latest good host set."""
        self.call(self.coordinator.set_hosts, hosts)

    def discovery_failed(self, message: str) -> None:
        self.call(self.coordinator.discovery_failed, message)

    # ---------------------------------------------------------------- plumbing
    def call(self, method: Callable, *args, **kwargs):
        """Run a coordinator method with the current time, then deliver its outbox. The
        coordinator acts on the inputs in batches (`_settle`): a pass looks at every host and
        worker, so the next waits as long as the last one took, and inputs gather meanwhile.
        With 8 hosts that is microseconds; with 512 it keeps a generation change (512 inputs)
        from costing 512 passes over 512 workers."""
        result = method(*args, self.clock(), **kwargs)
        self.flush_soon()
        return result

    def flush_soon(self) -> None:
        """Deliver what the coordinator said now, and settle its inputs soon (see `call`)."""
        self.flush()
        if not self._settle_scheduled:
            self._settle_scheduled = True
            # As long as the last pass took, counted from its end; after a quiet while, GATHER_S at
            # most, for the inputs that come together (a lost host's closing sessions) to be decided
            # on together (a lost host's inputs no longer wait a large job's last pass: docs/benchmarks.md).
            wait = max(min(self._settle_cost, GATHER_S), self._settled_at + self._settle_cost - time.perf_counter())
            asyncio.get_running_loop().call_later(wait, self._settle)

    def _settle(self) -> None:
        self._settle_scheduled = False
        started = time.perf_counter()
        if self.coordinator.settle(self.clock()):
            self._settled_at = time.perf_counter()
            self._settle_cost = self._settled_at - started
        self.flush()

    def flush(self) -> None:
        """Hand what the coordinator said to the sessions (after the journal saved it, with a store)."""
        messages = self.coordinator.drain()
        if self.journal is None:
            self.outbox.deliver(self.coordinator, messages)
        else:
            self._held.extend(messages)
            self._dirty.set()
            if messages:
                self._releasing.set()
        self.changed.set()
        gen = self.coordinator.generation
        if gen is not None and gen.number != self._heap_generation:
            self._heap_generation = gen.number
            asyncio.get_running_loop().call_later(HEAP_FREEZE_DELAY_S, self._freeze_heap, gen.number,
                                                  time.monotonic() + HEAP_FREEZE_LATEST_S)

    def _freeze_heap(self, number: int, latest: float) -> None:
        """Freeze the heap if generation `number` still runs (see `heap`), once its messages are out
        (a freeze in the middle of sending them would hold them up), or at `latest`."""
        gen = self.coordinator.generation
        if gen is None or gen.number != number or gen.over is not None or not self.heap.wanted(len(gen.member_ids)):
            return
        if time.monotonic() < latest and (self._held or self.outbox.pending()):
            asyncio.get_running_loop().call_later(HEAP_FREEZE_DELAY_S, self._freeze_heap, number, latest)
            return
        self.heap.settled(number, len(gen.member_ids))

    async def keep_journal(self) -> None:
        """Save the coordinator's record after changes (gathered, see `call`), then release what it said.
        Raises journal.Deposed when another rendezvous has taken the job over."""
        assert self.journal is not None
        while True:
            await self._dirty.wait()
            if not self._held and self._save_cost > 0:
                # Nothing waits on this save (a Ready, a worker's phase): changes gather for up
                # to QUIET_SAVE_DUTY times a save's cost, unless a message comes to be released.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._releasing.wait(), QUIET_SAVE_DUTY * self._save_cost)
            self._dirty.clear()
            self._releasing.clear()
            batch, self._held = self._held, []
            started = time.perf_counter()
            saved = self.coordinator.saved()
            marker = (recorded_changes(), saved.counters, len(saved.hosts), len(saved.workers))
            cost = 0.0
            if marker != self._saved_marker:  # (a heartbeat changes nothing the store keeps)
                prepared = time.perf_counter() - started
                cost = self._save_cost = prepared + await self.journal.save_job(saved)
                self._saved_marker = marker
            self.outbox.deliver(self.coordinator, batch)
            await asyncio.sleep(cost)  # as in `call`: let changes gather for as long as a record takes

    async def saved(self) -> None:
        """Wait until everything changed so far is in the store and said (the job's end)."""
        while self.journal is not None and (self._held or self._dirty.is_set()):
            await asyncio.sleep(0.01)

    def lease_expired(self, host: str) -> None:
        """An agent's lease ran out in the store. If the rendezvous itself was just stopped (it
        could not refresh anything), or waits for hosts that all fell silent at once (it may be
        the one cut off), and the agent's session is still open, the agent is not to blame: its
        lease is granted again. Otherwise its host is lost."""
        now = self.clock()
        window = 2.0 * (self.leases.ttl_s if self.leases is not None else 0.0)
        pool = self.coordinator.pool
        record = pool.hosts.get(host)
        if host in self.outbox.agents and record is not None and (
                pool.stalled_recently(now, window) or pool.waiting_out_isolation(now)):
            if self.leases is not None:
                self._background(self.leases.connected(host, record.agent_pid or 0))
            return
        self.call(lambda now: self.coordinator.agent_disconnected(host, now,
                                                                  "its lease in the store expired (no heartbeat)",
                                                                  silent=True))

    def _background(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pump(self, sessions: dict[str, asyncio.Queue], key: str, queue: asyncio.Queue,
                    is_last: Callable[[Any], bool], on_close: Callable) -> AsyncIterator:
        """Stream a session's queue until its last message or until the peer goes away; a peer
        that goes away (process died, host lost) is reported to the coordinator at once."""
        try:
            while True:
                message = await queue.get()
                if message is _REPLACED:
                    return
                # (handed to gRPC now: after the yield a busy loop resumes late)
                self.outbox.handed_over(message, self.clock())
                yield message
                if is_last(message):
                    return
        finally:
            if sessions.get(key) is queue:
                del sessions[key]
                self.call(on_close, key)

    # ---------------------------------------------------------------- agents
    async def AgentSession(self, request: pb.AgentHello,
                           context: grpc.aio.ServicerContext) -> AsyncIterator[pb.AgentCommand]:
        """An agent's session: its hello (host name checked first), then the commands for its host
        (workers to run, shutdown) until the job ends or the agent goes away, which counts as losing the host."""
        problem = host_name_problem(request.host)
        if problem:  # refused before it reaches the job's state or the store
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"agent hello refused: {problem}; start the agent "
                                                                  "with --host NAME")
        record = self.coordinator.pool.hosts.get(request.host)
        joining = self.coordinator.settings.hosts_from_agents and request.slots > 0
        if request.slots < 0 or request.slots > MAX_SLOTS_PER_HOST:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"agent hello refused: {request.slots} slots; give the agent --slots N with N from 1 "
                                f"to {MAX_SLOTS_PER_HOST}")
        if joining and (record is None or not record.joined) and self.coordinator.pool.joined_hosts() >= MAX_HOSTS:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{MAX_HOSTS} hosts have joined by connecting already, the most a job takes; host "
                                f"{request.host} is refused")
        if not joining and (record is None or not record.discovered) and request.host not in self.outbox.agents \
                and self._unlisted_agents() >= MAX_UNLISTED_AGENTS:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{MAX_UNLISTED_AGENTS} agents of hosts that discovery does not list are connected "
                                f"already; host {request.host} is taken once discovery lists it")
        live = self.outbox.agents.get(request.host)
        if live is not None:
            if self.outbox.incarnations.get(request.host) != request.incarnation:  # one agent process per host
                owner = record.agent_pid if record is not None else None
                await context.abort(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"host {request.host} already has an agent connected (pid {owner}); stop that agent first, "
                    "or start this one with another --host")
            live.put_nowait(_REPLACED)  # the same agent again (its old connection went dead): the old session just ends
        queue: asyncio.Queue = asyncio.Queue()
        self.outbox.agents[request.host] = queue
        self.outbox.incarnations[request.host] = request.incarnation
        self.outbox.agent_carries(request.host, request.carries_events, request.shares_events,
                                  request.shares_places)
        if self.leases is not None:
            self._background(self.leases.connected(request.host, request.pid))
        self.call(
            lambda now: self.coordinator.agent_connected(
                request.host,
                request.pid,
                now,
                list(request.running),
                incarnation=request.incarnation[:64],
                slots=request.slots,
                version="".join(c for c in request.version[:MAX_VERSION_CHARS] if c.isprintable()),
            )
        )
        try:
            async for message in self._pump(self.outbox.agents, request.host, queue, lambda m: m.shutdown,
                                            self._agent_gone):
                yield message
        finally:
            self.outbox.reroute(queue)

    def _unlisted_agents(self) -> int:
        """Agents in session for hosts that discovery does not list (they wait to be listed)."""
        hosts = self.coordinator.pool.hosts
        return sum(1 for host in self.outbox.agents if host not in hosts or not hosts[host].discovered)

    def _agent_gone(self, host: str, now: float) -> None:
        self.outbox.incarnations.pop(host, None)
        self.outbox.carriers.discard(host)
        if self.leases is not None:
            self._background(self.leases.disconnected(host))
        self.coordinator.agent_disconnected(host, now)

    async def AgentHeartbeat(self, request: pb.AgentHeartbeatRequest, context) -> pb.Ack:
        """An agent is alive (and its lease in the store is refreshed); it carries its workers'
        heartbeats when asked to (`Ack.relay_beats`): those of workers on its own host are taken,
        each as heard when the agent received it."""
        now = self.clock()
        self.coordinator.agent_heartbeat(request.host, now)
        if self.leases is not None:
            self._background(self.leases.heartbeat(request.host))
        if request.workers:
            self._relayed(request.host, request.workers, now)
        if request.busy:
            self.coordinator.workers_busy(request.host, request.busy[:MAX_RELAYED_BEATS], now)
        pace = self.coordinator.pace
        return pb.Ack(ok=True, heartbeat_interval_s=pace.agent_s, relay_beats=pace.relay)

    def _relayed(self, host: str, beats, now: float) -> None:
        """Take the workers' beats an agent relayed: at most MAX_RELAYED_BEATS, only of workers
        placed on its host, each with a sane age (else ignored: a broken agent cannot speak for
        another host's workers or move anyone's silence into the future)."""
        workers = self.coordinator.workers
        for relayed in beats[:MAX_RELAYED_BEATS]:
            worker = workers.get(relayed.beat.worker_id)
            age = relayed.age_s
            if worker is None or worker.host != host or not 0.0 <= age <= MAX_RELAYED_AGE_S:
                continue
            self._take_beat(relayed.beat, now - age)
            self.beats["agent"] += 1
        self.flush_soon()

    async def ReportWorkerExit(self, request: pb.WorkerExit, context) -> pb.Ack:
        """A worker process exited: its code or signal, and whether its agent stopped it. Only the
        agent in session for the worker's host reports it."""
        worker = self.coordinator.workers.get(request.worker_id)
        if request.host not in self.outbox.agents or (worker is not None and worker.host != request.host):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"an exit of worker {request.worker_id[:100]!r} reported for host "
                                f"{request.host[:100]!r}, which has no agent in session or does not run that worker; "
                                "ignored")
        self.call(lambda now: self.coordinator.worker_exited(
            request.host, request.worker_id, request.exit_code, request.signal, request.stopped_by_agent, now,
            output=request.output[:1000]))
        return pb.Ack(ok=True)

    async def CarryReady(self, request: pb.CarriedReady, context) -> pb.CarriedReadyAnswer:
        """The `Ready`s of a host's workers, carried by its agent (one call where a membership
        change would make one per worker): each taken as the worker's own call is, for workers
        placed on that host only, at most MAX_RELAYED_BEATS; the refused are named in the answer
        (the agent logs them: a worker counted failed or leaving is stopped or retired anyway)."""
        host = request.host
        if host not in self.outbox.agents:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"Ready requests carried for host {host[:100]!r}, which has no agent in session; "
                                "ignored")
        answer, taken = take_carried(self.coordinator, host, request.ready[:MAX_RELAYED_BEATS], self.clock())
        self.readies["agent"] += taken
        self.flush_soon()
        return answer

    async def DrainHost(self, request: pb.DrainRequest, context) -> pb.Ack:
        """The agent's host goes away (SIGTERM, a notice) or its notice was withdrawn. Only the
        agent in session for the host asks; a bad deadline is refused naming it."""
        host = request.host
        if host not in self.outbox.agents:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"a drain of host {host[:100]!r}, which has no agent in session; ignored")
        source = DrainSource.NOTICE if request.notice else DrainSource.SIGNAL
        incarnation = self.outbox.incarnations.get(host, "")
        try:
            if request.withdraw:
                self.call(lambda now: self.coordinator.undrain_host(host, now, source, "its notice was withdrawn"))
                return pb.Ack(ok=True, message=f"host {host} may be used again")
            drain = self.call(lambda now: self.coordinator.drain_host(
                host, request.deadline_s, now, source, request.reason[:200], incarnation))
        except Refused as refused:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(refused))
        return pb.Ack(ok=True, message=f"draining host {host} until {drain.deadline_at - self.clock():.1f} s from now")

    # ---------------------------------------------------------------- workers
    async def WorkerSession(self, request: pb.WorkerHello,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WorkerEvent]:
        """A worker's session: assignments, generation-over, host updates, retire and job-end
        notices until it leaves; a session that closes early is a failed worker, noticed at once."""
        queue: asyncio.Queue = asyncio.Queue()
        self.outbox.workers[request.worker_id] = queue
        if request.hears_agent:
            self.outbox.hearing_agent.add(request.worker_id)
        else:
            self.outbox.hearing_agent.discard(request.worker_id)
        try:
            self.call(lambda now: self.coordinator.worker_connected(
                request.worker_id, request.pid, now, request.after_generation if request.waiting else None,
                request.failure, request.elastic))
        except Refused as refused:
            del self.outbox.workers[request.worker_id]
            self.outbox.hearing_agent.discard(request.worker_id)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refused))
        try:
            async for message in self._pump(self.outbox.workers, request.worker_id, queue,
                                            lambda m: m.HasField("job_ended") or m.HasField("retire"),
                                            self.coordinator.worker_disconnected):
                yield message
        finally:
            if request.worker_id not in self.outbox.workers:  # (not when a newer session replaced this one)
                self.outbox.hearing_agent.discard(request.worker_id)
            if self.outbox.assignments_out.watching:  # (what it did not write goes nowhere)
                self.outbox.assignments_out.dropped(queue.get_nowait() for _ in range(queue.qsize()))

    async def Ready(self, request: pb.ReadyRequest, context) -> pb.Ack:
        """A worker is ready for the generation after `after_generation` (a survivor after a reset,
        or a newcomer that warmed up); `failure` says why its last generation ended, if it did."""
        try:
            self.call(self.coordinator.worker_ready, request.worker_id, request.after_generation, request.failure,
                      request.elastic, awaits_hosts=request.awaits_hosts)
        except Refused as refused:
            return pb.Ack(ok=False, message=str(refused))
        self.readies["worker"] += 1
        return pb.Ack(ok=True)

    async def WorkerHeartbeat(self, request: pb.WorkerHeartbeatRequest, context) -> pb.Ack:
        """A worker is alive (see `_take_beat`); it beats itself, or through its agent when asked."""
        self._take_beat(request)
        self.beats["worker"] += 1
        self.flush_soon()
        return pb.Ack(ok=True, heartbeat_interval_s=self.coordinator.pace.worker_s)

    def _take_beat(self, request: pb.WorkerHeartbeatRequest, heard_at: float | None = None) -> None:
        """A worker's heartbeat: its commit count, whether it runs `hvd.elastic.run`, and what it
        carries besides (`BeatFigures`)."""
        self.coordinator.worker_heartbeat(request.worker_id, request.commits, request.elastic, self.clock(),
                                          steps_since_commit=request.steps_since_commit, heard_at=heard_at)
        found = self.beat_figures.take(self.coordinator, request)
        if found:
            self.call(lambda at: self.coordinator.stragglers_seen(found, at))

    async def ReportDone(self, request: pb.DoneRequest, context) -> pb.Ack:
        """A worker's training function returned (with a warning for the job's end, bounded), or
        it says the job cannot go on (`fatal`, bounded)."""
        warning, fatal = request.warning[:2000], request.fatal[:2000]
        if fatal:
            self.call(lambda now: self.coordinator.worker_fatal(request.worker_id, fatal, now))
        else:
            self.call(lambda now: self.coordinator.worker_done(request.worker_id, request.commits, now, warning))
        return pb.Ack(ok=True)
