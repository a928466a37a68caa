"""The hosts that joined a pool by connecting (`ringmaster pool agent`), and what each is asked to run.

A host's pool agent polls the pool (`POST /hosts/{name}/poll`, held open until something changes):
it says its slots, which jobs' agents it runs and which ended (and how); the answer is the list
of orders for that host, one per job placed on it (the job's rendezvous, that host's agent key
for the job, the job's timings). The board is both the pool's source of hosts (`find_hosts`:
the hosts whose agent polled within `timeout_s`) and, through `BoardLauncher`, every job's
launcher on them: a job's `start(host)` is an order on the board, its `stop(host)` a withdrawal.

So one process per host serves every job placed there; it starts, for each job, that job's own
agent (a child holding that job's key only, as under `--launcher local`), never a pool secret.
A host that stops polling leaves the board after `timeout_s`, and each job it served hears that
its agent there ended (as with any launcher), while the job's own heartbeats find it lost first.

Thread-safe (a lock): the pool's loop, its host poller (a thread) and `stop_all` (a thread) use it.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

from ringmaster.common.errors import Refused
from ringmaster.common.pool_host_wire import POLL_HOLD_S
from ringmaster.discovery.parse import MAX_HOSTS, MAX_SLOTS_PER_HOST, host_name_problem
from ringmaster.launch.launchers import AgentOptions
from ringmaster.rendezvous.scheduling.resources import RESOURCES

#: Seconds a host's pool agent may go without polling before the host leaves the pool.
DEFAULT_HOST_TIMEOUT_S = 15.0
#: Most of one resource (GPUs, CPUs) a host may declare.
MAX_RESOURCE = 1e6
#: Most job agents one host reports at once (running or ended) in a poll.
MAX_REPORTED = 1024


class BoardRefusal(Refused):
    """A poll the board refuses; the message names the host and what to do. `status` is HTTP's."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Order:
    """Run job `job`'s agent on the host: dial `options.rendezvous`, prove `key` (hex)."""

    job: str
    options: AgentOptions
    key: str
    attempt: int = 1
    gpus_per_worker: float = 0.0  # none: the host's agent hides its GPUs from the job

    @property
    def run(self) -> str:
        """The run of the job it is for: a job started again (resumed) has another rendezvous, so
        what is said of one run's agents never reaches the next."""
        return f"{self.job}@{self.options.rendezvous}"

    @property
    def ident(self) -> str:
        """Names this order: an agent a run launches again on the host is another attempt; a
        host's agent runs each order once."""
        return f"{self.run}#{self.attempt}"


@dataclass
class _Joined:
    slots: int
    session: str
    seen: float
    resources: dict[str, float] = field(default_factory=dict)
    pid: int | None = None
    orders: dict[str, Order] = field(default_factory=dict)  # run -> order
    given: dict[str, str] = field(default_factory=dict)  # ident -> run, of orders given and not yet ended
    running: set[str] = field(default_factory=set)  # order idents its agent says run
    version: int = 0
    withdrawn: dict[str, int] = field(default_factory=dict)  # ident -> version its order left the board at


class HostBoard:
    """Joined hosts, their orders, and what their agents said of the jobs' agents."""

    def __init__(self, timeout_s: float = DEFAULT_HOST_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._hosts: dict[str, _Joined] = {}
        self._ended: dict[str, list[tuple[str, str]]] = {}  # run -> [(host, how)]
        self._pending: dict[str, dict[str, tuple[Order, float]]] = {}  # host not joined -> run -> (order, since)

    # ------------------------------------------------------------ the pool's source of hosts
    def find_hosts(self) -> dict[str, int]:
        with self._lock:
            return {name: joined.slots for name, joined in self._hosts.items()}

    def find_resources(self) -> dict[str, dict[str, float]]:
        """What each joined host declares besides its slots (GPUs, CPUs)."""
        with self._lock:
            return {name: dict(joined.resources) for name, joined in self._hosts.items()}

    def describe(self) -> str:
        return "pool agents that join by connecting"

    # ------------------------------------------------------------ what a host's agent says
    def poll(self, host: str, session: str | None, slots: int, running: list[str], ended: list[tuple[str, str]],
             now: float, resources: Mapping[str, float] | None = None, pid: int | None = None,
             applied: int = -1) -> tuple[str, int]:
        """A host's agent reports in: its session (None: it joins now), its slots and `resources`
        (GPUs, CPUs), the orders whose agents run and those that ended with how, and `applied`,
        the version of the orders it has acted on. Returns its session and the version of its orders.

        Each order given ends exactly once for its job (`take_ended`), or the job's launcher would
        wait forever to launch on the host again: when the host says its agent ended, when the
        host leaves, or, for an order withdrawn before the host's agent started it, when the host
        has acted on orders without it and does not run it. A report that does not list an order
        as running is not its end: two polls of one host cross (one held open, one saying an agent
        ended), and the one without the order may arrive first."""
        problem = host_name_problem(host)
        if problem:
            raise BoardRefusal(f"host name {host[:80]!r}: {problem}")
        if not 1 <= slots <= MAX_SLOTS_PER_HOST:
            raise BoardRefusal(f"host {host}: {slots} slots; a host has 1 to {MAX_SLOTS_PER_HOST}")
        resources = dict(resources or {})
        for name, amount in resources.items():
            if name not in RESOURCES or not 0 <= amount <= MAX_RESOURCE:
                raise BoardRefusal(f"host {host}: resource {name[:40]!r} = {amount!r}; a host declares "
                                   f"{', '.join(RESOURCES)}, each from 0 to {MAX_RESOURCE:g}")
        if len(running) > MAX_REPORTED or len(ended) > MAX_REPORTED:
            raise BoardRefusal(f"host {host}: reports more than {MAX_REPORTED} job agents at once")
        with self._lock:
            joined = self._hosts.get(host)
            known = joined is not None and session == joined.session  # (`applied` speaks of its orders)
            if joined is not None and session != joined.session:
                if now - joined.seen <= self.timeout_s:
                    raise BoardRefusal(f"host {host} has joined the pool already, from another `pool agent`: stop that "
                                       f"one, or wait {self.timeout_s:.0f} s after it stopped", status=409)
                self._drop(host, "its pool agent was replaced by another")
                joined = None
            if joined is None:
                if len(self._hosts) >= MAX_HOSTS:
                    raise BoardRefusal(f"the pool has {MAX_HOSTS} hosts already; host {host} cannot join", status=429)
                joined = self._hosts[host] = _Joined(slots, secrets.token_hex(16), now)
                for order, _ in self._pending.pop(host, {}).values():
                    joined.orders[order.run] = order
                    joined.given[order.ident] = order.run
                    joined.version += 1
            joined.seen = now
            joined.slots, joined.resources, joined.pid = slots, resources, pid
            for ident, how in ended:  # (only of orders this host was given: it speaks for itself only)
                run = joined.given.pop(ident, None)
                if run is not None:
                    self._ended.setdefault(run, []).append((host, how[:2000]))
            joined.running = {ident for ident in running if ident in joined.given}
            if known:
                for ident, at in list(joined.withdrawn.items()):
                    run = joined.given.get(ident)
                    if run is not None and at <= applied and ident not in joined.running:
                        del joined.given[ident]
                        self._ended.setdefault(run, []).append(
                            (host, f"host {host}'s pool agent never started it: the order was withdrawn first"))
            joined.withdrawn = {i: at for i, at in joined.withdrawn.items() if i in joined.given}
            return joined.session, joined.version

    @property
    def hold_s(self) -> float:
        """How long a poll is held open: well within the time after which a quiet host leaves."""
        return min(POLL_HOLD_S, self.timeout_s / 3)

    def orders(self, host: str, session: str, now: float) -> tuple[int, list[Order]] | None:
        """The version and orders of `host`, as its poll is answered at `now` (it counts as seen
        then); None: that session is not the host's."""
        with self._lock:
            joined = self._hosts.get(host)
            if joined is None or joined.session != session:
                return None
            joined.seen = now
            return joined.version, list(joined.orders.values())

    def version(self, host: str) -> int | None:
        with self._lock:
            joined = self._hosts.get(host)
            return joined.version if joined is not None else None

    def leave(self, host: str, session: str) -> bool:
        """A host's agent stops (its job agents stopped first): it leaves at once."""
        with self._lock:
            joined = self._hosts.get(host)
            if joined is None or joined.session != session:
                return False
            self._drop(host, "its pool agent left the pool")
            return True

    def stalled(self, seconds: float) -> None:
        """The pool did not run for `seconds` (stopped, swapped out, starved): the polls hosts sent
        meanwhile wait unread in its sockets, so that time is not counted as their silence."""
        with self._lock:
            for joined in self._hosts.values():
                joined.seen += seconds
            for waiting in self._pending.values():
                for run, (order, since) in list(waiting.items()):
                    waiting[run] = (order, since + seconds)

    def lapse(self, now: float) -> list[str]:
        """Hosts whose agent has not polled within `timeout_s` leave; their names. An order for a
        host that has not joined within `timeout_s` ends (its job hears its agent never started)."""
        with self._lock:
            gone = [h for h, joined in self._hosts.items() if now - joined.seen > self.timeout_s]
            for host in gone:
                self._drop(host, f"its pool agent has not reported for {self.timeout_s:.0f} s")
            late = time.monotonic() - self.timeout_s
            for host, waiting in list(self._pending.items()):
                for run, (order, since) in list(waiting.items()):
                    if since < late:
                        del waiting[run]
                        self._ended.setdefault(run, []).append(
                            (host, f"host {host} has no pool agent connected (start `ringmaster pool agent` there)"))
                if not waiting:
                    del self._pending[host]
            return gone

    def _drop(self, host: str, why: str) -> None:
        joined = self._hosts.pop(host)
        for run in {*joined.orders, *joined.given.values()}:
            self._ended.setdefault(run, []).append((host, f"host {host} left the pool: {why}"))

    # ------------------------------------------------------------ what jobs ask (`BoardLauncher`)
    def order(self, host: str, order: Order) -> None:
        with self._lock:
            joined = self._hosts.get(host)
            if joined is None:  # it may be joining (again) now: the order waits for it, for a while
                self._pending.setdefault(host, {})[order.run] = (order, time.monotonic())
                return
            before = joined.orders.get(order.run)
            if before != order:
                joined.orders[order.run] = order
                joined.given[order.ident] = order.run
                joined.version += 1
                if before is not None and before.ident != order.ident:
                    joined.withdrawn[before.ident] = joined.version

    def withdraw(self, host: str, run: str) -> None:
        with self._lock:
            self._pending.get(host, {}).pop(run, None)
            joined = self._hosts.get(host)
            if joined is not None:
                self._withdraw(joined, run)

    def withdraw_all(self, run: str) -> None:
        with self._lock:
            for waiting in self._pending.values():
                waiting.pop(run, None)
            for joined in self._hosts.values():
                self._withdraw(joined, run)

    @staticmethod
    def _withdraw(joined: _Joined, run: str) -> None:
        order = joined.orders.pop(run, None)
        if order is not None:
            joined.version += 1
            joined.withdrawn[order.ident] = joined.version

    def take_ended(self, run: str) -> list[tuple[str, str]]:
        with self._lock:
            return self._ended.pop(run, [])

    def forget(self, run: str) -> None:
        """A run is over: what its hosts say of it from now on is dropped."""
        with self._lock:
            self._ended.pop(run, None)
            for joined in self._hosts.values():
                joined.given = {i: r for i, r in joined.given.items() if r != run}
                joined.running = {i for i in joined.running if i in joined.given}
                joined.withdrawn = {i: at for i, at in joined.withdrawn.items() if i in joined.given}

    def running(self, run: str) -> int:
        """Hosts whose agent says it runs the run's agent (ordered or on its way out)."""
        with self._lock:
            return sum(
                1 for joined in self._hosts.values() if any(joined.given.get(ident) == run for ident in joined.running)
            )

    def pids(self) -> dict[str, int | None]:
        """Each joined host's pool agent's process id, as it says."""
        with self._lock:
            return {name: joined.pid for name, joined in self._hosts.items()}
