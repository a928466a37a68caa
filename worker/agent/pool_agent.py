"""`ringmaster pool agent`: the one process on a host that joins it to a pool and serves every job
placed there.

It polls the pool (`POST /hosts/{name}/poll`, held open until something changes) with its slots
and what its jobs' agents did; the answer lists one order per job placed on this host. For each
order it starts that job's own agent (`ringmaster agent --from-launcher`, as `--launcher local`
does, the order's key on its stdin), and stops it when the order is withdrawn. So this process
holds the host's pool key (derived from the pool's join secret, which it forgets) and, for a
moment, the agent keys of the jobs placed here; each job's agent and workers hold only their own
job's key.

When the pool cannot be reached, the jobs' agents go on (they talk to their own rendezvous), and
this process asks again with a growing pause. SIGTERM or SIGINT: the jobs' agents drain this host
(their workers leave at their next commit: no job loses a step), then the host leaves the pool.

One thread starts and stops the jobs' agents: the main one, which also drains them and ends
last. A thread holds the pool's answer open and only hands the orders over. The jobs' agents die
with their parent (`die_with_parent`, so a killed host agent leaves no orphan), and the kernel's
parent-death signal follows the *thread* that started a process, not the process: an agent
started by the polling thread was SIGKILLed the moment that thread ended on SIGTERM, before its
workers reached the commit they were draining to (its rendezvous counted the host lost).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import ValidationError

from ringmaster.common.api_client import ApiClient, ApiError
from ringmaster.common.errors import UsageError
from ringmaster.common.events import Kind
from ringmaster.common.handover import handover
from ringmaster.common.pool_host_wire import POLL_HOLD_S, OrderRow, PollAnswer
from ringmaster.common.tls import TLS_CA_ENV, read_pem
from ringmaster.launch.launchers import AgentOptions, LocalLauncher

#: Seconds of the first and the longest pause before asking an unreachable pool again.
RETRY_FIRST_S = 0.5
RETRY_MOST_S = 5.0
#: Most characters of how a job's agent ended said to the pool (its last lines, the newest kept).
MAX_HOW_CHARS = 2000
#: Seconds between two looks at the jobs' agents (one that ended is said to the pool at once).
WATCH_S = 0.1
#: Seconds the jobs' agents have to drain this host (their workers leave at a commit) when this
#: process stops, and then to stop.
DRAIN_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
#: Refusals that asking again will not change: the process ends with the pool's reason.
FINAL_STATUSES = (400, 401, 403, 404, 409, 422)


@dataclass
class _Running:
    order: OrderRow
    launcher: LocalLauncher
    stopping: bool = False


class PoolAgent:
    """One host's membership of a pool: poll, then start and stop jobs' agents to match the orders."""

    def __init__(self, client: ApiClient, host: str, slots: int, say: Callable[..., None],
                 resources: dict[str, float] | None = None, warm_ahead: bool = True) -> None:
        self.client, self.host, self.slots, self.say = client, host, slots, say
        self.resources = dict(resources or {})
        self.session: str | None = None
        self.version = -1
        self.agents: dict[str, _Running] = {}  # order -> its job's agent
        self.done: set[str] = set()  # orders whose agent ran and ended (each order runs once)
        self.unsent: list[dict[str, str]] = []  # agents that ended, not yet said to the pool
        self.saying: set[str] = set()  # orders whose end was sent, the pool's answer not yet in
        self.applied = -1  # the version of the orders acted on (of this session)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.ready: ReadyLauncher | None = None  # a job's agent started ahead of its order, warming
        self.template: tuple[AgentOptions, dict[str, str]] | None = None  # the last order's options
        self.warm_ahead = warm_ahead
        self.refused: str | None = None
        self._orders: tuple[int, list[OrderRow]] | None = None  # the newest answer's, not yet applied
        self._wake = threading.Event()  # orders came, or stop: the main thread looks at once

    def report(self) -> list[str]:
        """The orders whose agents run; those that ended since are kept to be sent (with how).
        An order whose end is on its way to the pool is still said to run: the pool counts an
        order's end only once it heard it, and another poll may overtake the one that says it."""
        running = sorted(self.saying)
        for ident, agent in list(self.agents.items()):
            alive = agent.launcher.alive()
            for _, how in agent.launcher.ended():
                self.unsent.append({"order": ident, "how": how[-MAX_HOW_CHARS:]})
            if alive:
                running.append(ident)
            else:
                del self.agents[ident]
                self.done.add(ident)
        return running

    def exchange(self, hold: bool) -> PollAnswer:
        """One poll: what runs and what ended out, the host's orders in (held by the pool until
        they change when `hold`; at once otherwise, to say an agent ended without delay). An
        answer older than one already applied (two polls cross) is not applied."""
        with self.lock:
            running = self.report()
            sent, self.unsent = self.unsent, []
            self.saying.update(entry["order"] for entry in sent)
            body = {"session": self.session, "slots": self.slots, "version": self.version if hold else -1,
                    "applied": self.applied, "running": running, "ended": sent, "resources": self.resources,
                    "pid": os.getpid()}
        try:
            raw: Any = self.client.post(f"/hosts/{self.host}/poll", body)
            answer = PollAnswer.model_validate(raw)
        except ValidationError as exc:
            with self.lock:
                self.unsent = sent + self.unsent
            raise ApiError(f"{self.client.api} answered a poll with something else than orders: "
                           f"{str(exc).splitlines()[0]}") from None
        except ApiError:
            with self.lock:
                self.unsent = sent + self.unsent  # said again with the next poll
            raise
        with self.lock:
            self.saying.difference_update(entry["order"] for entry in sent)  # (the pool has heard them)
            if answer.session != self.session:
                self.say(Kind.POOL_AGENT_JOINED, host=self.host, pool=self.client.api, slots=self.slots)
                self.applied = -1  # (versions count anew in a new session)
            elif answer.version < self.version:
                return answer
            self.session, self.version = answer.session, answer.version
            self._orders = (answer.version, answer.orders)  # applied by the main thread (see the module's docstring)
        self._wake.set()
        return answer

    def apply_received(self) -> None:
        """Apply the newest orders received, if any came since the last look (main thread only)."""
        with self.lock:
            received, self._orders = self._orders, None
            if received is not None:
                version, orders = received
                self.apply(orders)
                self.applied = version

    def request_stop(self) -> None:
        """SIGTERM, SIGINT, the pool's refusal, or stdin closed: the main thread drains and stops."""
        self.stop_event.set()
        self._wake.set()

    def apply(self, orders: list[OrderRow]) -> None:
        if self.stop_event.is_set():
            # The host is being taken politely (`stop_all`): its jobs' agents are draining it. An
            # answer still in flight may no longer list a job the pool has moved off this host as
            # it drains; stopping that job's agent now would kill its workers before their commit
            # (and its rendezvous would count the host lost).
            return
        wanted = {order.order: order for order in orders}
        self.done &= set(wanted)  # (remembered while the pool still lists the order)
        for ident, agent in self.agents.items():
            if ident not in wanted and not agent.stopping:
                agent.stopping = True
                self.say(Kind.POOL_AGENT_STOPS, host=self.host, job=agent.order.job,
                         why="the pool took the job off this host")
                agent.launcher.stop(self.host)
        for ident, order in wanted.items():
            if ident in self.agents or ident in self.done or self.stop_event.is_set():
                continue
            options = AgentOptions(order.rendezvous, order.heartbeat_interval_s, order.stop_grace_s,
                                   order.reconnect_timeout_s, order.spares, order.drain_grace_s)
            environment = job_environment(order, self.resources)
            ready, self.ready = self.ready, None
            if ready is not None and ready.fits(options,
                                                environment) and ready.give(self.host, order.key, order.rendezvous):
                launcher: LocalLauncher = ready  # warm: its spares have been importing torch meanwhile
                self.say(Kind.POOL_AGENT_STARTS, host=self.host, job=order.job, rendezvous=order.rendezvous, warm=True)
            else:
                if ready is not None:
                    ready.stop_all(0.0)
                launcher = LocalLauncher(options, None, key=order.key, environment=environment)
                self.say(Kind.POOL_AGENT_STARTS, host=self.host, job=order.job, rendezvous=order.rendezvous, warm=False)
                launcher.start(self.host)
            self.agents[ident] = _Running(order, launcher)
            self.template = (options, environment)
        self._keep_one_ready()

    def _keep_one_ready(self) -> None:
        """An agent started ahead of the next order, like the last one's (the pool gives its
        jobs the same timings), so that job's first workers here start warm."""
        if self.ready is not None and not self.ready.alive():
            self.ready = None
        if self.ready is None and self.template is not None and self.warm_ahead and not self.stop_event.is_set():
            options, environment = self.template
            self.ready = ReadyLauncher(options, environment, self.slots)
            self.ready.start(self.host)

    def run(self) -> int:
        """Poll until stopped (a thread holds the pool's answer open; this one says at once when
        a job's agent ended); 0 when stopped, an error when the pool refuses this host for good."""
        poller = threading.Thread(target=self._poll_until_stopped, daemon=True)
        poller.start()
        try:
            while True:
                self._wake.wait(WATCH_S)
                self._wake.clear()
                if self.stop_event.is_set():
                    break
                self.apply_received()
                with self.lock:
                    ended = any(not agent.launcher.alive() for agent in self.agents.values())
                if ended:
                    with contextlib.suppress(ApiError):
                        self.exchange(hold=False)
                    self.apply_received()
            if self.refused is not None:
                raise UsageError(f"the pool refused host {self.host}: {self.refused}")
            return 0
        finally:
            self.stop_all()

    def _poll_until_stopped(self) -> None:
        pause = RETRY_FIRST_S
        while not self.stop_event.is_set():
            try:
                self.exchange(hold=True)
                pause = RETRY_FIRST_S
            except ApiError as exc:
                if exc.status in FINAL_STATUSES:
                    self.refused = str(exc)
                    self.request_stop()
                    return
                self.say(Kind.POOL_AGENT_TROUBLE, host=self.host, error=str(exc), retry_s=pause)
                self.stop_event.wait(pause)
                pause = min(pause * 2, RETRY_MOST_S)

    def stop_all(self) -> None:
        """The host is taken politely: each job's agent drains it (its workers leave at their next
        commit, so no job loses work), then this host leaves the pool."""
        self.stop_event.set()
        with self.lock:  # (the poller starts nothing once stopped)
            running = list(self.agents.values())
            ready, self.ready = self.ready, None
        if ready is not None:
            ready.stop_all(0.0)
        for agent in running:
            for launched in agent.launcher.agents.values():
                with contextlib.suppress(OSError):
                    launched.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for agent in running:
            for launched in agent.launcher.agents.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    launched.proc.wait(max(0.0, deadline - time.monotonic()))
        for agent in running:
            agent.launcher.stop_all(STOP_TIMEOUT_S)
        if self.session is not None:
            try:
                self.client.post(f"/hosts/{self.host}/leave", {"session": self.session})
            except ApiError:
                pass  # the pool lets the host lapse instead
        self.agents.clear()


class ReadyLauncher(LocalLauncher):
    """A job's agent started before its job is known (`--await-order`): it warms a spare per slot
    while it waits; its order (the job's rendezvous and this host's key for the job) comes later."""

    hands_over_at_start = False

    def __init__(self, options: AgentOptions, environment: dict[str, str], slots: int) -> None:
        super().__init__(options, None, environment=environment)
        self.options, self.environment, self.slots = options, dict(environment), slots

    def _argv(self, host: str, remote: bool) -> list[str]:
        argv = super()._argv(host, remote)
        at = argv.index("--rendezvous")
        return [*argv[:at], *argv[at + 2:], "--await-order", "--slots", str(self.slots)]

    def fits(self, options: AgentOptions, environment: dict[str, str]) -> bool:
        """Whether it can serve an order with these options and environment (all but the
        rendezvous, which comes with the order, are fixed at its start)."""
        return options == dataclasses.replace(self.options, rendezvous=options.rendezvous) and \
            environment == self.environment and bool(self.alive())

    def give(self, host: str, key: str, rendezvous: str) -> bool:
        return self.hand_over(host, handover(key, {}, rendezvous))


def job_environment(order: OrderRow, resources: dict[str, float]) -> dict[str, str]:
    """What a job's agent (and so its workers) gets set here: a job that asked for no GPU sees
    none on a host that has some (another job's workers may be using them)."""
    return {"CUDA_VISIBLE_DEVICES": ""} if order.gpus_per_worker == 0 and resources.get("gpu", 0) > 0 else {}


def run_pool_agent(pool: str, host: str, slots: int, resources: dict[str, float], key: str, tls_ca: str | None,
                   say: Callable[..., None], stop_when_stdin_closes: bool = False, warm_ahead: bool = True) -> int:
    """`ringmaster pool agent`: join `pool` as `host` proving `key` (hex) until SIGTERM/SIGINT
    (or, started by the pool, until its stdin closes: the pool is gone or let the host go)."""
    if not host:
        raise UsageError("--host NAME: the name this host has in the pool")
    pem = os.environ.get(TLS_CA_ENV) or None  # (the pool that started it hands its CA so)
    if tls_ca:  # the jobs' agents this process starts speak TLS to their rendezvous with the same CA
        os.environ[TLS_CA_ENV] = read_pem(tls_ca, "--tls-ca").decode()
    client = ApiClient(pool, key, tls_ca, timeout_s=POLL_HOLD_S + 15.0, tls_ca_pem=None if tls_ca else pem)
    agent = PoolAgent(client, host, slots, say, resources, warm_ahead)

    def stop(signum: int, frame: object) -> None:
        agent.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if stop_when_stdin_closes:
        def wait_for_eof() -> None:
            while sys.stdin.buffer.read(4096):
                pass
            agent.request_stop()

        threading.Thread(target=wait_for_eof, daemon=True).start()
    return agent.run()
