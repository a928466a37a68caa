"""Thousands of hosts simulated by a few processes: each host an agent and its workers, speaking
the real gRPC protocol with real keys (grpc.aio clients, many per process), for the scale
harness (`bench/scale.py`) and its test.

A simulated agent does what `ringmaster agent` does on the wire: its hello, heartbeats, and for
every `AgentCommand` it starts the workers it names (and reports the ones it stops); a simulated
worker does what a worker's `Link` does: its session, heartbeats with commits (through its agent
when the rendezvous asks agents to carry them: the simulated agent then reads its workers'
figures itself at each of its beats, where a real one relays the newest datagram each worker
sent it, so that 32,768 workers do not cost the client processes 32,768 timers a second),
`Ready` once warm, again after a "generation over" that does not place it unasked, and at its
next commit after a "hosts updated" that does not (the one member that reports the commit); its
agent hands it the messages the rendezvous sent for the whole host, and (while it carries their
beats) carries its workers' `Ready`s together in one `CarryReady`, as worker/agent/ready_relay.py
does. No process is started and nothing trains: what is measured is the rendezvous.

`FleetProcess` runs a `Fleet` (a share of the hosts) in a child process driven over a pipe, so
the harness can spread the clients over processes; everything it answers is small (a summary
per change), except `assignments()`, asked once per change for the correctness checks.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import multiprocessing
import multiprocessing.connection
import os
import random
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from ringmaster.common.event_relay import each_worker
from ringmaster.common.heartbeats import paced_interval
from ringmaster.common.keys import AGENT, WORKER, Identity, key_of
from ringmaster.common.seal import TOKEN_KEY, body_of, make_token
from ringmaster.proto import environment as env_names
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.worker.agent.ready_relay import GATHER_S

#: Sessions a simulated worker opens at most (a broken one is opened again, as by a real worker).
SESSION_ATTEMPTS = 5
#: Seconds a simulated worker takes to restore its last commit after a "generation over".
ROLLBACK_S = 0.01
#: Seconds a simulated newcomer warms up between opening its session and its `Ready`.
WARMUP_S = 0.1
#: Hosts that share one gRPC connection (an agent's stream and its workers' fit HTTP/2's stream limit).
HOSTS_PER_CHANNEL = 10


@dataclass
class SimWorker:
    worker_id: str
    host: str
    identity: Identity
    key: bytes
    generation: int = 0
    rank: int = -1
    size: int = 0
    hosts_sequence: int = 0
    assigned_at: float = 0.0  # time.monotonic() (one clock for every process of the machine)
    commits: int = 0
    steps: int = 0
    gone: bool = False
    waiting: tuple[int, str] | None = None  # (after generation, failure) of its last Ready, until assigned
    stopped_at: float = 0.0  # when it stopped training in its generation (its commit, a rollback); 0: training
    pause: float = 0.0  # from then until it held its next assignment (a survivor's pause in the last change)
    tasks: list[asyncio.Task] = field(default_factory=list)
    call: Any = None


@dataclass
class SimHost:
    name: str
    key: bytes
    workers: dict[str, SimWorker] = field(default_factory=dict)
    tasks: list[asyncio.Task] = field(default_factory=list)
    shut: bool = False
    relay: bool = False  # the rendezvous asked its agent to carry its workers' beats
    session: Any = None  # the agent's session call
    beats_own: asyncio.Event = field(default_factory=asyncio.Event)  # set while its workers beat themselves
    readies: dict[str, pb.ReadyRequest] = field(default_factory=dict)  # its workers' `Ready`s it will carry
    carrying: asyncio.Task | None = None  # the task that carries them after the gathering window


class Fleet:
    """A share of the simulated hosts, on this process' event loop."""

    def __init__(self, address: str, secret: str, heartbeat_s: float, carry_events: bool = True) -> None:
        """`carry_events`: agents carry their workers' messages when the rendezvous sends them so
        (`AgentCommand.events`), as `ringmaster agent` does; else every worker hears its own stream."""
        self.address, self.secret, self.heartbeat_s = address, secret, heartbeat_s
        self.carry_events = carry_events
        self.hosts: dict[str, SimHost] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: dict[str, pb_grpc.RendezvousStub] = {}
        self.calls = 0  # calls made (heartbeats included)
        self.refused = 0  # calls the rendezvous refused or that failed
        self.last_refusal = ""
        self._series = secrets.token_hex(8)
        self.session_errors: collections.Counter[str] = collections.Counter()  # how worker sessions ended early
        self._numbers: dict[Identity, int] = {}
        self._frozen_generation = 0  # the generation settled when the heap was last frozen
        #: When the steps of a change were seen here, the first and the last time of each (`mark`):
        #: newcomers started, their `Ready`s carried, members hearing the host update, assignments held.
        self.marks: dict[str, list[float]] = {}

    def _stub(self, host: str) -> pb_grpc.RendezvousStub:
        stub = self._stubs.get(host)
        if stub is None:
            if not self._channels or len(self._stubs) >= HOSTS_PER_CHANNEL * len(self._channels):
                self._channels.append(grpc.aio.insecure_channel(self.address))
            stub = self._stubs[host] = pb_grpc.RendezvousStub(self._channels[-1])
        return stub

    def _sign(self, method: str, identity: Identity, key: bytes, request: Any) -> tuple[tuple[str, str], ...]:
        """A token numbered in `identity`'s own series, as its real process would number it (one
        series for thousands of callers would put one caller's calls far apart)."""
        self.calls += 1
        number = self._numbers[identity] = self._numbers.get(identity, 0) + 1
        token = make_token(key, identity, f"/ringmaster.v1.Rendezvous/{method}", body_of(request), time.time(),
                           (self._series, number))
        return ((TOKEN_KEY, token),)

    async def _unary(self, host: str, method: str, identity: Identity, key: bytes, request: Any) -> pb.Ack | None:
        try:
            return await getattr(self._stub(host), method)(request, metadata=self._sign(method, identity, key, request),
                                                           timeout=60)
        except grpc.aio.AioRpcError as exc:
            self.refused += 1
            self.last_refusal = f"{method}: {exc.code().name}: {exc.details()}"
            return None

    # ------------------------------------------------------------ hosts
    def add(self, names: list[str], slots: int) -> None:
        for name in names:
            if name in self.hosts:
                continue
            host = self.hosts[name] = SimHost(name, key_of(self.secret, Identity(AGENT, name)))
            host.tasks.append(asyncio.create_task(self._agent(host, slots)))

    def kill(self, names: list[str]) -> None:
        """The hosts die: every stream of theirs closes, nothing is reported (as a machine lost)."""
        for name in names:
            host = self.hosts.pop(name, None)
            if host is not None:
                for worker in host.workers.values():
                    self._end_worker(worker)
                if host.session is not None:
                    host.session.cancel()  # (closed now, as a dead machine's connection: not when its task ends)
                for task in host.tasks:
                    task.cancel()

    async def _agent(self, host: SimHost, slots: int) -> None:
        me = Identity(AGENT, host.name)
        hello = pb.AgentHello(host=host.name, pid=os.getpid(), incarnation=f"{os.getpid()}-{host.name}", slots=slots,
                              carries_events=self.carry_events, shares_events=self.carry_events,
                              shares_places=self.carry_events)
        host.tasks.append(asyncio.create_task(self._agent_beats(host)))
        for _ in range(SESSION_ATTEMPTS):  # (a session that breaks is opened again, as `ringmaster agent` does)
            try:
                session = host.session = self._stub(host.name).AgentSession(
                    hello, metadata=self._sign("AgentSession", me, host.key, hello), wait_for_ready=True)
                async for command in session:
                    if command.shutdown:
                        host.shut = True
                        for worker in list(host.workers.values()):
                            self._end_worker(worker)
                        host.workers.clear()
                        return
                    if command.events:  # (its workers' messages: each handed to its own, as over the host's socket)
                        self._hand_over(host, command.events)
                        continue
                    await self._run_workers(host, command.workers)
                return
            except grpc.aio.AioRpcError as exc:
                self.refused += 1
                self.last_refusal = f"AgentSession: {exc.code().name}: {exc.details()}"

    def mark(self, step: str) -> None:
        """A step of the change under way seen now (time.monotonic: one clock for the machine)."""
        now = time.monotonic()
        seen = self.marks.get(step)
        if seen is None:
            self.marks[step] = [now, now]
        else:
            seen[1] = now

    async def _run_workers(self, host: SimHost, specs: Any) -> None:
        """The host's complete list of workers: those not on it stop, the new ones start."""
        wanted = {spec.worker_id for spec in specs}
        for worker_id in [w for w in host.workers if w not in wanted]:
            await self._stop_worker(host, host.workers.pop(worker_id))
        for spec in specs:
            if spec.worker_id in host.workers:
                continue
            identity = Identity(WORKER, host.name, spec.worker_id)
            worker = host.workers[spec.worker_id] = SimWorker(spec.worker_id, host.name, identity,
                                                              key_of(self.secret, identity))
            start = int(spec.env.get(env_names.GENERATION, "0") or 0)
            self.mark("newcomer started")
            worker.tasks.append(asyncio.create_task(self._worker(worker, start)))

    def _hand_over(self, host: SimHost, events: Any) -> None:
        """Give each of the host's workers its carried messages, in order; what a worker answers
        with a call (a host update's `Ready`) runs on its own task."""
        for hosted in events:
            kind = hosted.event.WhichOneof("event")
            # (one entry said alike to several workers; an assignment's places: each its own ranks)
            for worker_id, event in each_worker(hosted) or ():
                worker = host.workers.get(worker_id)
                if worker is None or worker.gone:
                    continue
                if kind == "hosts_updated":
                    worker.tasks.append(asyncio.create_task(self._on_event(worker, event)))
                elif kind == "retire":  # (it leaves: its session closes)
                    self._end_worker(worker)
                else:
                    self._take(worker, event)

    async def _agent_beats(self, host: SimHost) -> None:
        me = Identity(AGENT, host.name)
        await asyncio.sleep(random.uniform(0, self.heartbeat_s))  # (spread, as agents started apart)
        interval = self.heartbeat_s
        host.beats_own.set()
        last = time.monotonic()
        while not host.shut:
            now = time.monotonic()
            beats = max(1, round((now - last) / self.heartbeat_s))  # (the beats each worker sent it meanwhile)
            last = now
            relayed = [pb.RelayedBeat(beat=self._beat(w, beats), age_s=0.0)
                       for w in host.workers.values() if not w.gone] if host.relay else []
            beat = pb.AgentHeartbeatRequest(host=host.name, workers=relayed)
            answer = await self._unary(host.name, "AgentHeartbeat", me, host.key, beat)
            if answer is not None:
                interval = paced_interval(answer.heartbeat_interval_s, self.heartbeat_s)
                host.relay = answer.relay_beats
                if host.relay:
                    host.beats_own.clear()
                else:
                    host.beats_own.set()
            await asyncio.sleep(interval)

    async def _stop_worker(self, host: SimHost, worker: SimWorker) -> None:
        self._end_worker(worker)
        report = pb.WorkerExit(host=host.name, worker_id=worker.worker_id, signal=15, stopped_by_agent=True)
        await self._unary(host.name, "ReportWorkerExit", Identity(AGENT, host.name), host.key, report)

    @staticmethod
    def _end_worker(worker: SimWorker) -> None:
        worker.gone = True
        if worker.call is not None:
            worker.call.cancel()
        for task in worker.tasks:
            task.cancel()

    # ------------------------------------------------------------ workers
    async def _worker(self, worker: SimWorker, start_generation: int) -> None:
        """A worker started into `start_generation` waits for its assignment; a newcomer (0)
        opens its session, warms up (WARMUP_S here) and asks for the next generation. A session
        that breaks is opened again saying what the worker waits for, as a worker's `Link` does."""
        worker.tasks.append(asyncio.create_task(self._worker_beats(worker)))
        for attempt in range(SESSION_ATTEMPTS):
            waiting = worker.waiting
            hello = pb.WorkerHello(worker_id=worker.worker_id, host=worker.host, pid=os.getpid(), elastic=True,
                                   waiting=waiting is not None, after_generation=waiting[0] if waiting else 0,
                                   failure=waiting[1] if waiting else "", hears_agent=self.carry_events)
            worker.call = self._stub(worker.host).WorkerSession(
                hello, metadata=self._sign("WorkerSession", worker.identity, worker.key, hello), wait_for_ready=True)
            if attempt == 0 and start_generation == 0:
                worker.tasks.append(asyncio.create_task(self._warm_up(worker)))
            try:
                async for event in worker.call:
                    if not await self._on_event(worker, event):
                        worker.gone = True
                        return
                break  # the rendezvous ended the session
            except grpc.aio.AioRpcError as exc:
                self.session_errors[f"{exc.code().name}: {exc.details()}"[:200]] += 1
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    break  # not (or no longer) of this job
                await asyncio.sleep(random.uniform(0.5, 1.0) * 2 ** attempt)  # (backing off, as a worker does)
        worker.gone = True

    async def _warm_up(self, worker: SimWorker) -> None:
        """A newcomer's warm-up: a real one builds its model for seconds after its session opened;
        at once, its `Ready` would reach the rendezvous before its session did."""
        await asyncio.sleep(WARMUP_S)
        await self._ready(worker, 0, "")

    async def _on_event(self, worker: SimWorker, event: pb.WorkerEvent) -> bool:
        """What a worker does with a message of its session; False when it leaves."""
        kind = event.WhichOneof("event")
        if kind == "hosts_updated" and event.hosts_updated.sequence > worker.hosts_sequence:
            worker.hosts_sequence = event.hosts_updated.sequence
            self.mark("host update heard")
            worker.commits += 1  # (its next commit comes at once) ...
            worker.stopped_at = worker.stopped_at or time.monotonic()
            if not event.hosts_updated.placed:  # (... raises HostsUpdatedInterrupt, and reports it)
                await self._ready(worker, worker.generation, "")
        elif kind in ("retire", "job_ended"):
            return False
        else:
            self._take(worker, event)
        return True

    def _take(self, worker: SimWorker, event: pb.WorkerEvent) -> None:
        """An assignment or a generation's end, which a worker acts on without a call."""
        kind = event.WhichOneof("event")
        if kind == "assignment" and event.assignment.generation > worker.generation:
            a = event.assignment
            survivor = worker.generation > 0
            worker.generation, worker.rank, worker.size = a.generation, a.rank, a.size
            worker.hosts_sequence, worker.assigned_at, worker.waiting = a.hosts_sequence, time.monotonic(), None
            self.mark("assignment held")
            # (a survivor placed before it stopped, as after a peer's failure, paused from that word)
            worker.pause = worker.assigned_at - (worker.stopped_at or worker.assigned_at) if survivor else 0.0
            worker.stopped_at = 0.0
        elif kind == "generation_over" and event.generation_over.generation == worker.generation:
            worker.stopped_at = worker.stopped_at or time.monotonic()  # (it rolls back to its last commit)
            if not event.generation_over.rejoin:  # (placed unasked: it only waits for its place)
                worker.tasks.append(asyncio.create_task(self._roll_back(worker, worker.generation)))

    async def _roll_back(self, worker: SimWorker, generation: int) -> None:
        """After a "generation over": restore the last commit (a few milliseconds), then ask for
        the next generation, unless assigned to it meanwhile (as a `Link` does)."""
        await asyncio.sleep(ROLLBACK_S)
        if worker.generation <= generation:
            await self._ready(worker, generation, "peer died")

    async def _ready(self, worker: SimWorker, after: int, failure: str) -> None:
        """Its `Ready`: its own call, or (its agent carrying beats and messages) its agent's to carry."""
        worker.waiting = (after, failure)
        request = pb.ReadyRequest(worker_id=worker.worker_id, after_generation=after, failure=failure, elastic=True)
        host = self.hosts.get(worker.host)
        if host is None or not (host.relay and self.carry_events):
            self.mark("Ready asked")
            await self._unary(worker.host, "Ready", worker.identity, worker.key, request)
            self.mark("Ready answered")
            return
        host.readies[worker.worker_id] = request
        if len(host.readies) >= sum(1 for w in host.workers.values() if not w.gone):
            await self._carry_readies(host)
        elif host.carrying is None:
            host.carrying = asyncio.create_task(self._carry_readies(host, GATHER_S))

    async def _carry_readies(self, host: SimHost, after_s: float = 0.0) -> None:
        """Carry the host's gathered `Ready`s in one call (now, or after the gathering window)."""
        if after_s:
            await asyncio.sleep(after_s)  # (the agent's gathering window itself, as ready_relay.py waits it)
            host.carrying = None
        if host.readies:
            batch, host.readies = list(host.readies.values()), {}
            self.mark("Ready carried")
            await self._unary(host.name, "CarryReady", Identity(AGENT, host.name), host.key,
                              pb.CarriedReady(host=host.name, ready=batch))

    async def _worker_beats(self, worker: SimWorker) -> None:
        """Its own heartbeats, while its agent does not carry them (see the module's docstring)."""
        await asyncio.sleep(random.uniform(0, self.heartbeat_s))
        interval = self.heartbeat_s
        while not worker.gone:
            host = self.hosts[worker.host]
            if host.relay:
                await host.beats_own.wait()
                continue
            answer = await self._unary(worker.host, "WorkerHeartbeat", worker.identity, worker.key,
                                       self._beat(worker, 1))
            if answer is not None:
                interval = paced_interval(answer.heartbeat_interval_s, self.heartbeat_s)
            await asyncio.sleep(interval)

    @staticmethod
    def _beat(worker: SimWorker, beats: int) -> pb.WorkerHeartbeatRequest:
        """A worker's heartbeat after `beats` intervals: 10 steps and one commit each, once it trains."""
        if worker.generation:
            worker.steps += 10 * beats
            worker.commits += beats
        stats = pb.WorkerStats(steps=pb.Timing(count=worker.steps, seconds=worker.steps * 0.01))
        return pb.WorkerHeartbeatRequest(worker_id=worker.worker_id, commits=worker.commits, elastic=True, stats=stats)

    # ------------------------------------------------------------ what it sees
    def summary(self) -> dict[str, Any]:
        """Its running workers: how many, their lowest and highest generation, when the last of
        those at the highest got it; the calls made and refused."""
        live = [w for h in self.hosts.values() for w in h.workers.values() if not w.gone]
        gens = [w.generation for w in live]
        top = max(gens, default=0)
        if top > self._frozen_generation and min(gens) == top:
            # Settled: what lives now lives long. One process holds thousands of simulated hosts
            # (a real agent holds one), so full collections over all of them would stall it
            # while the next change's messages come in: the harness' cost, not the rendezvous'.
            self._frozen_generation = top
            gc.freeze()
        return {"workers": len(live), "hosts": sum(1 for h in self.hosts.values() if not h.shut),
                "min_generation": min(gens, default=0), "max_generation": top,
                "last_assigned": max((w.assigned_at for w in live if w.generation == top), default=0.0),
                "first_assigned": min((w.assigned_at for w in live if w.generation == top), default=0.0),
                "longest_pause": max((w.pause for w in live if w.generation == top), default=0.0),
                "calls": self.calls, "refused": self.refused, "last_refusal": self.last_refusal,
                "session_errors": dict(self.session_errors)}

    def take_marks(self) -> dict[str, list[float]]:
        """The steps seen since this was last asked (each its first and last time), forgotten here."""
        marks, self.marks = self.marks, {}
        return marks

    def assignments(self) -> list[tuple[str, str, int, int, int]]:
        """(worker, host, generation, rank, size) of every running worker."""
        return [(w.worker_id, w.host, w.generation, w.rank, w.size)
                for h in self.hosts.values() for w in h.workers.values() if not w.gone]

    async def close(self) -> None:
        self.kill(list(self.hosts))
        for channel in self._channels:
            await channel.close()


def _serve_fleet(conn: multiprocessing.connection.Connection, address: str, secret: str, heartbeat_s: float,
                 carry_events: bool) -> None:
    """A fleet process: commands from the pipe, run on the fleet's loop; each answered."""
    loop = asyncio.new_event_loop()
    fleet: Fleet | None = None

    async def start() -> Fleet:
        return Fleet(address, secret, heartbeat_s, carry_events)

    fleet = loop.run_until_complete(start())
    done = asyncio.Event()

    def commands() -> None:
        while True:
            try:
                name, args = conn.recv()
            except EOFError:
                name, args = "close", ()
            future = asyncio.run_coroutine_threadsafe(_command(fleet, name, args), loop)
            conn.send(future.result())
            if name == "close":
                loop.call_soon_threadsafe(done.set)
                return

    threading.Thread(target=commands, daemon=True).start()
    loop.run_until_complete(done.wait())
    loop.close()


async def _command(fleet: Fleet, name: str, args: tuple) -> Any:
    if name == "add":
        fleet.add(*args)
        return None
    if name == "kill":
        fleet.kill(*args)
        return None
    if name == "summary":
        return fleet.summary()
    if name == "assignments":
        return fleet.assignments()
    if name == "take_marks":
        return fleet.take_marks()
    if name == "close":
        await fleet.close()
        return None
    raise ValueError(f"unknown fleet command {name!r}")


class FleetProcess:
    """A `Fleet` in a child process of its own (its own session: killed with its group)."""

    def __init__(self, address: str, secret: str, heartbeat_s: float, carry_events: bool = True) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve_fleet, args=(child, address, secret, heartbeat_s, carry_events),
                                       daemon=True)
        self.process.start()
        child.close()

    def ask(self, name: str, *args: Any, timeout_s: float = 120) -> Any:
        self._conn.send((name, args))
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"the fleet process did not answer {name!r} within {timeout_s:g} s")
        return self._conn.recv()

    def close(self) -> None:
        try:
            self.ask("close", timeout_s=30)
        except (OSError, EOFError, TimeoutError):
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
