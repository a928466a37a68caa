"""Everything the rendezvous runs, on one asyncio loop: gRPC service, stores, control API,
discovery polling and the coordinator's clock.

`RendezvousServer` is used by `ringmaster run` (which starts the hosts' agents) and by
`ringmaster serve` (agents connect from other machines). It first becomes the job's leader in
its state store (a `serve` stands by while another leads), carries on the job the store holds
if there is one, and keeps the store up to date (write-ahead) until the job ends, when the
job's keys are removed. A leader that loses its leader key stops without touching the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from functools import partial
from typing import Any, Callable, Mapping

import grpc
import uvicorn

from ringmaster.common import logs
from ringmaster.common.events import Event, Kind, log_event
from ringmaster.common.grpc_auth import RendezvousAuth
from ringmaster.common.network import this_machine_names
from ringmaster.common.spans import now_us
from ringmaster.common.tls import ServerTls
from ringmaster.discovery import HostDiscovery
from ringmaster.launch.launch_plan import SshOptions
from ringmaster.launch.launchers import AgentOptions, Launcher, LauncherFactory, NoLauncher, make_launcher
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.rendezvous.control.coordinator import Coordinator, RingStoreAddress
from ringmaster.rendezvous.control.records import JobOutcome
from ringmaster.rendezvous.control.view import ALL_ROWS, NO_ROWS, JobView, Page
from ringmaster.rendezvous.server.call_rights import call_refused, identity_problem
from ringmaster.rendezvous.server.discovery_poller import poll_discovery
from ringmaster.rendezvous.server.grpc_limits import server_options
from ringmaster.rendezvous.server.grpc_service import RendezvousService
from ringmaster.rendezvous.server.http_api import EventFollowers, create_app
from ringmaster.rendezvous.server.http_guard import guarded_protocol, quiet_repeats, raise_open_file_limit
from ringmaster.rendezvous.server.metrics import JobMetrics
from ringmaster.rendezvous.server.peer_limit import MAX_PER_PEER, keep_peers_within
from ringmaster.rendezvous.server.timeline import TraceBuilder
from ringmaster.rendezvous.server.torch_store import TorchStoreHost
from ringmaster.rendezvous.server.trace_file import JobTimeline, TraceFile
from ringmaster.rendezvous.state.agent_leases import AgentLeases
from ringmaster.rendezvous.state.journal import Deposed, Journal
from ringmaster.rendezvous.state.kv import KeyValueStore
from ringmaster.rendezvous.state.leadership import DEFAULT_LEADER_TTL_S, Leadership
from ringmaster.rendezvous.state.open_store import open_store
from ringmaster.rendezvous.state.url import StoreSpec
from ringmaster.settings import AGENT_EXIT_GRACE_S, REMOTE_AGENTS_SHUTDOWN_S, JobSettings

#: Seconds between two runs of the coordinator's clock (heartbeat and start timeouts).
TICK_S = 0.2
#: A run of the clock looks at every host and worker (a fifth of a second at 32,768 workers):
#: the next waits at least this many times as long as the last took, so the clock never takes
#: more than a tenth of a core, and a small job keeps its TICK_S.
TICK_DUTY = 10.0


def run_clock(tick: Callable[[], object]) -> float:
    """Run the clock once; the seconds until its next run, from what this one cost the loop
    thread's CPU (`time.thread_time`), not the wall clock: a rendezvous stopped during a run
    (SIGSTOP, swapped out) counted the stop ten times over, planned the next run that far away,
    and took the gap for a planned one, neither saying it had stalled nor judging anyone's
    silence for as long (found by the stall test on a loaded CI machine)."""
    started = time.thread_time()
    tick()
    return max(TICK_S, TICK_DUTY * (time.thread_time() - started))


#: Seconds the end of a job waits for its last state to reach the store.
FINAL_SAVE_TIMEOUT_S = 10.0
#: Refused calls logged one by one before only every hundredth is.
REFUSALS_LOGGED = 20
#: Seconds calls in flight get when the gRPC server stops.
GRPC_STOP_GRACE_S = 0.5
#: Seconds the control API is given to close its connections when the job ends.
API_STOP_S = 5.0
#: At the job's end, the most seconds the control API waits for a reader of /events to fetch the
#: last ones; a reader that asked nothing for FOLLOWER_IDLE_S is not waited for (`ringmaster
#: events --follow` asks every 0.5 s).
FOLLOWER_GRACE_S = 3.0
FOLLOWER_IDLE_S = 1.5


log = logging.getLogger(logs.RENDEZVOUS)


def _say(kind: Kind, **fields: object) -> None:
    log_event(log, Event(kind, fields))


class _ApiServer(uvicorn.Server):
    """uvicorn inside our loop: the job, not uvicorn, owns SIGINT and SIGTERM."""

    def capture_signals(self):  # type: ignore[override]
        return contextlib.nullcontext()


class RendezvousServer:
    def __init__(
        self,
        settings: JobSettings,
        discovery: HostDiscovery,
        bind: str = "127.0.0.1",
        port: int = 0,
        api_port: int | None = 0,
        local_hosts: bool = True,
        launcher: str | LauncherFactory = "local",
        ssh: SshOptions = SshOptions(),
        advertise: str | None = None,
        store: StoreSpec = StoreSpec("memory"),
        leader_ttl_s: int = DEFAULT_LEADER_TTL_S,
        secret: str | None = None,
        tls: ServerTls | None = None,
        on_api: Callable[[str], None] | None = None,
        observe: Callable[[Event], None] | None = None,
    ) -> None:
        """`secret`: the job secret. Every gRPC call must prove a key derived from it (its agent's,
        its worker's) and every change through the control API must carry it; `None` (tests of
        the parts alone) checks nothing. `on_api(url)` hears the control API's URL once it listens;
        `observe(event)` hears every event of the job (a pool learns of its hosts' failures so)."""
        self.secret = secret
        self.tls = tls
        self.store_spec = store
        self.leader_ttl_s = leader_ttl_s
        self.settings = settings
        self.discovery = discovery
        self.bind = bind
        # What agents and workers on other hosts dial: the bind address unless it is a wildcard.
        self.advertise = advertise or (socket.gethostname() if bind in ("0.0.0.0", "::", "") else bind)
        self.port = port
        self.api_port = api_port
        self.use_local_hosts = local_hosts and launcher != "none"  # this process starts the agents
        self.launcher = launcher
        self.ssh = ssh
        self.address = ""
        self.api_url: str | None = None
        self.coordinator: Coordinator | None = None
        self.service: RendezvousService | None = None
        self._stop_reason: str | None = None
        self._preempt_reason: str | None = None
        self.metrics: JobMetrics | None = None
        self.followers = EventFollowers()  # readers of GET /events, given their last events at the end
        self.timeline: JobTimeline | None = None
        self._open_files = 1024  # the soft descriptor limit, as `run` finds it
        self._on_api = on_api
        self._observe = observe

    def request_preemption(self, reason: str) -> None:
        """The whole job is taken (SIGUSR1 under Slurm): drain every host, then end as preempted."""
        self._preempt_reason = reason
        if self.service is not None:
            self.service.changed.set()

    def request_stop(self, reason: str) -> None:
        """Stop the job (SIGINT/SIGTERM): it ends as failed with `reason`."""
        self._stop_reason = reason
        if self.service is not None:
            self.service.changed.set()

    async def run(self, initial_hosts: Mapping[str, int]) -> JobOutcome:
        """Lead the job (or stand by until it can), then run it to its end. Raises
        StoreUnavailable, AnotherLeader or IncompatibleState before anything starts."""
        # the rings' store, gRPC and the API share this process' descriptors
        self._open_files = raise_open_file_limit()[0]
        asyncio.get_running_loop().set_exception_handler(quiet_repeats())
        store = await open_store(self.store_spec)
        try:
            return await self._lead(store, initial_hosts)
        finally:
            with contextlib.suppress(Exception):
                await store.close()

    def _open_timeline(self) -> JobTimeline | None:
        """The job's timeline file (--timeline), or None; RingmasterError when it cannot be written."""
        if not self.settings.timeline:
            return None

        def members() -> list[tuple[str, str]]:
            view = self.view(NO_ROWS)
            return list(view.members) if view is not None else []

        def written(file: TraceFile) -> None:
            _say(Kind.TIMELINE_WRITTEN, path=str(file.path), megabytes=file.total_bytes / 1e6,
                 rotated=f"; older parts in {file.path.name}.1" if file.rotations else "")

        return JobTimeline(self.settings.timeline, self.settings.timeline_max_mb << 20, TraceBuilder(members), now_us,
                           lambda error: _say(Kind.TIMELINE_FAILED, error=error), written)

    async def _lead(self, store: KeyValueStore, initial_hosts: Mapping[str, int]) -> JobOutcome:
        prefix = self.store_spec.prefix
        try:
            return await self._lead_with_timeline(store, initial_hosts, prefix)
        finally:
            if self.timeline is not None:
                self.timeline.close()

    async def _lead_with_timeline(self, store: KeyValueStore, initial_hosts: Mapping[str, int],
                                  prefix: str) -> JobOutcome:
        wanted = f"{self.advertise}:{self.port}" if self.port else f"{self.advertise}:(a free port)"
        leadership = Leadership(store, prefix, wanted, self.leader_ttl_s)
        await leadership.acquire(wait=not self.use_local_hosts)
        journal = Journal(store, prefix, leadership)
        try:
            restored = await journal.load()
            self.timeline = self._open_timeline()  # only once leading: a standby must not touch the leader's file
        except Exception:
            await leadership.resign()
            raise
        if restored is not None and restored.counters.outcome is not None:
            _say(Kind.JOB_PREVIOUS_ENDED, prefix=prefix, outcome=restored.counters.outcome[1])
            restored = None

        ring_stores = TorchStoreHost(self.bind, self.advertise)
        grpc_server = grpc.aio.server(options=server_options(self._open_files))
        port = grpc_server.add_secure_port(f"{self.bind}:{self.port}", self.tls.grpc_credentials()) if self.tls \
            else grpc_server.add_insecure_port(f"{self.bind}:{self.port}")
        self.address = f"{self.advertise}:{port}"
        if self.address != leadership.address:
            await leadership.announce(self.address)
        launcher = self._make_launcher()
        coordinator = Coordinator(
            self.settings, self.address, RingStoreAddress(ring_stores.host, ring_stores.port), ring_stores.plain_store,
            on_event=self._on_event, launches_agents=launcher.starts_agents,
        )
        self.coordinator = coordinator
        service, leases = self._make_service(coordinator, journal, launcher, store, prefix)
        pb_grpc.add_RendezvousServicer_to_server(
            self.auth.guard(service,
                            pb.DESCRIPTOR.services_by_name["Rendezvous"]) if self.auth is not None else service,
            grpc_server)
        background: list[asyncio.Task] = []
        api = None
        api_serving: asyncio.Task | None = None
        deposed: str | None = None
        try:
            if restored is not None:
                # Before serving: a worker that reconnects to a rendezvous taking over must find
                # the job it belongs to (told "not part of this job", it would leave the ring).
                await leases.adopt()
                service.call(lambda now: coordinator.resume(restored, now, agents_survive=not launcher.starts_agents))
            await grpc_server.start()
            joining = " and agents that join by connecting" if self.settings.hosts_from_agents else ""
            _say(Kind.RENDEZVOUS_LISTENING, address=self.address, discovery=self.discovery.describe() + joining,
                 store=self.store_spec.describe())
            if self.api_port is not None:
                api, sock = self._make_api(service)
                api_serving = asyncio.create_task(api.serve(sockets=[sock]))
            if restored is None:
                service.call(coordinator.set_hosts, dict(initial_hosts))
            journal_task = asyncio.create_task(service.keep_journal())
            background += [journal_task, *self._background(service, leadership, journal, leases, port)]
            deposed = await self._run_job(coordinator, service, leadership, journal_task, ring_stores, launcher)
            if deposed is None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(service.saved(), FINAL_SAVE_TIMEOUT_S)
                await self._wind_down(launcher)
                await journal.clear()
                await self._let_followers_catch_up(service)
        except Deposed as exc:
            deposed = str(exc)
        finally:
            for task in background:
                task.cancel()
            if api is not None and api_serving is not None:
                await _stop_api(api, api_serving, sock)
            await asyncio.to_thread(launcher.stop_all, 0.0)
            ring_stores.close()
            await grpc_server.stop(grace=GRPC_STOP_GRACE_S)
            await leadership.resign()
        if deposed is not None:
            _say(Kind.LEADER_DEPOSED, reason=deposed)
            return JobOutcome(False, f"this rendezvous stopped leading the job ({deposed}); the job goes on under the "
                                     "new leader")
        assert coordinator.outcome is not None
        return coordinator.outcome

    def _background(self, service: RendezvousService, leadership: Leadership, journal: Journal,
                    leases: AgentLeases, port: int) -> list[asyncio.Task]:
        """What runs beside the job's loop: discovery, the leader key and the job's lease, the
        agents' leases, and the limit of connections per peer."""
        assert self.metrics is not None  # (made with the service)
        return [
            asyncio.create_task(poll_discovery(self.discovery, service, self.settings.discovery_interval_s,
                                               self.metrics.discovery)),
            asyncio.create_task(leadership.keep(journal.trouble)),
            asyncio.create_task(journal.keep_job_lease()),
            asyncio.create_task(leases.watch()),
            asyncio.create_task(keep_peers_within(port, lambda peer, count: _say(
                Kind.PEER_LIMITED, peer=peer, count=count, limit=MAX_PER_PEER),
                proven=self.auth.proven.snapshot if self.auth is not None else lambda: ())),
        ]

    def _make_launcher(self) -> Launcher:
        """What starts the hosts' agents: nothing where they are started by something else."""
        options = AgentOptions(self.address, self.settings.heartbeat_interval_s, self.settings.stop_grace_s,
                               self.settings.reconnect_timeout_s, self.settings.spares, self.settings.drain_grace_s,
                               self.settings.notice_script, self.settings.notice_interval_s)
        if not self.use_local_hosts:
            return NoLauncher()
        if isinstance(self.launcher, str):
            return make_launcher(self.launcher, options, self.secret, self.ssh,
                                 on_event=lambda host, how: _say(Kind.AGENT_LAUNCHING, host=host, how=how))
        return self.launcher(options, self.secret)

    def _make_service(self, coordinator: Coordinator, journal: Journal, launcher: Launcher, store: KeyValueStore,
                      prefix: str) -> tuple[RendezvousService, AgentLeases]:
        """The gRPC service of the job, with its callers' rights, its metrics and its agents' leases."""
        service = RendezvousService(coordinator, journal=journal, launcher=launcher)
        self.auth = RendezvousAuth(self.secret, self._refused, identity_problem,
                                   partial(call_refused, coordinator)) \
            if self.secret is not None else None
        self.metrics = JobMetrics(lambda: coordinator.view(service.clock(), NO_ROWS),
                                  lambda: self.auth.refused if self.auth is not None else 0,
                                  lambda: journal.degraded, address=self.address)
        service.beat_figures.figures = self.metrics.figures
        service.beat_figures.step_times = self.metrics.step_times
        self.metrics.heartbeats = lambda: service.beats
        self.metrics.readies = lambda: service.readies
        self.metrics.worker_messages = lambda: service.outbox.messages
        service.outbox.on_assignments_out = self.metrics.assignments_out
        self.metrics.step_times.window_steps = self.settings.straggler_steps
        service.beat_figures.timeline = self.timeline
        leases = AgentLeases(store, prefix, lambda: coordinator.pace.agent_timeout_s, service.lease_expired)
        service.leases = leases
        self.service = service
        return service, leases

    async def _run_job(self, coordinator: Coordinator, service: RendezvousService, leadership: Leadership,
                       journal_task: asyncio.Task, ring_stores: TorchStoreHost, launcher: Launcher) -> str | None:
        """Tick the job until it ends (or is stopped, or its rings' store fails); returns why this
        rendezvous stopped leading it, or None."""
        next_tick = time.monotonic() + TICK_S
        while coordinator.outcome is None:
            if leadership.lost.is_set():
                return leadership.lost_reason
            if journal_task.done():
                journal_task.result()  # an unexpected error surfaces here
            if (no_store := ring_stores.problem()) is not None:
                service.call(coordinator.abort, no_store)
                break
            if self._stop_reason:
                service.call(coordinator.abort, self._stop_reason)
                break
            if self._preempt_reason:
                service.call(coordinator.preempt, self._preempt_reason, self.settings.drain_grace_s)
                self._preempt_reason = None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(service.changed.wait(), max(0.0, next_tick - time.monotonic()))
            service.changed.clear()
            if time.monotonic() >= next_tick:
                every = run_clock(lambda: service.call(coordinator.tick))
                coordinator.pool.tick_every_s = every  # (a planned gap: no stall)
                next_tick = time.monotonic() + every
                if self.timeline is not None:
                    self.timeline.flush()
            for host, how in launcher.ended():  # an input like any other (journaled with the rest)
                service.call(coordinator.agent_process_ended, host, how)
        return None

    async def _wind_down(self, launcher: Launcher) -> None:
        """Give agents time to receive the shutdown and stop their workers gracefully."""
        if not launcher.starts_agents:
            await asyncio.sleep(REMOTE_AGENTS_SHUTDOWN_S)
            return
        deadline = time.monotonic() + self.settings.stop_grace_s + AGENT_EXIT_GRACE_S
        while launcher.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _let_followers_catch_up(self, service: RendezvousService) -> None:
        """Keep the control API up until a reader of /events (`ringmaster events --follow`) has
        fetched the job's last events, for at most FOLLOWER_GRACE_S; at once when nobody reads."""
        deadline = time.monotonic() + FOLLOWER_GRACE_S
        while time.monotonic() < deadline and not self.followers.caught_up(service.view(NO_ROWS), FOLLOWER_IDLE_S):
            await asyncio.sleep(0.05)

    def _on_event(self, event: Event) -> None:
        """The coordinator's events: logged, and counted by the metrics."""
        log_event(log, event)
        if self.metrics is not None:
            self.metrics.on_event(event)
        if self.timeline is not None:
            self.timeline.on_event(event)
        if self._observe is not None:
            self._observe(event)

    def _refused(self, method: str, reason: str) -> None:
        """Log a refused call: the first ones, then one in a hundred (a flood must not flood the log)."""
        assert self.auth is not None
        if self.auth.refused <= REFUSALS_LOGGED or self.auth.refused % 100 == 0:
            _say(Kind.CALL_REFUSED, method=method, reason=reason, refused=self.auth.refused)

    def view(self, page: Page = ALL_ROWS) -> JobView | None:
        """The job as readers see it now, listing the hosts and workers of `page` (None before
        this rendezvous leads it)."""
        return self.service.view(page) if self.service is not None else None

    def _make_api(self, service: RendezvousService) -> tuple[_ApiServer, socket.socket]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.bind, self.api_port or 0))
        protocol = guarded_protocol(self._open_files)
        sock.listen(protocol.max_connections)  # connections queue from now on: the URL said below answers at once
        self.api_url = f"{'https' if self.tls else 'http'}://{self.advertise}:{sock.getsockname()[1]}"
        _say(Kind.API_LISTENING, url=self.api_url)
        if self._on_api is not None:
            self._on_api(self.api_url)
        auth = self.auth
        refused = (lambda: auth.refused) if auth is not None else (lambda: 0)
        names = this_machine_names() | {self.advertise, self.bind}
        config = uvicorn.Config(create_app(service.view, service.scale_to, secret=self.secret, refused_calls=refused,
                                           metrics=self.metrics, followers=self.followers, host_names=names,
                                           drain=service.drain_host, undrain=service.undrain_host),
                                log_level="warning", lifespan="off",
                                http=protocol, backlog=protocol.max_connections,
                                ssl_certfile=self.tls.cert_file if self.tls else None,
                                ssl_keyfile=self.tls.key_file if self.tls else None)
        return _ApiServer(config), sock


async def _stop_api(api: Any, serving: asyncio.Task, sock: socket.socket) -> None:
    """Shut the control API down, not cancelled: a cancelled uvicorn leaves its listening server
    up, and the API of a job that ended went on answering "running"."""
    api.should_exit = True
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
        await asyncio.wait_for(serving, API_STOP_S)
    sock.close()
