"""The pool's hosts: those its source names, those whose pool agent joined its board, and those out
of the pool for a cooldown after a failure. The pool service places jobs on what this says is
usable; it does not itself poll the source, start pool agents or judge silent hosts.

Every host runs one pool agent, which joins the board and serves every job placed there. With
`--hosts-from-agents` the board is the source: hosts join by connecting. Otherwise the source
(-H, a discovery script) names the hosts and a launcher starts a pool agent on each
(`host_agents`), proving a key derived from the pool's join secret.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from ringmaster.common.events import Kind
from ringmaster.common.secret import generate_secret
from ringmaster.discovery import DiscoveryError, HostDiscovery
from ringmaster.launch.launch_plan import SshOptions
from ringmaster.launch.launchers import Launcher
from ringmaster.rendezvous.control.host_pool import STALL_S
from ringmaster.rendezvous.pool.host_agents import pool_agent_launcher
from ringmaster.rendezvous.pool.host_board import HostBoard

#: Launchers that start a pool agent on each named host (`--launcher`).
HOST_AGENT_LAUNCHERS = ("local", "ssh", "slurm")
#: Seconds the pool agents it started have, when the pool stops, to stop.
HOST_AGENTS_STOP_S = 10.0
#: Seconds between two looks at whether the pool's own loop runs, and at its hosts' silence
#: (`watch_own_stalls`); a look later than due by `STALL_S` (the rendezvous' rule) is a stall.
STALL_PROBE_S = 0.25


class PoolHosts:
    """Which hosts the pool has and which of them are usable now."""

    def __init__(self, source: HostDiscovery, board: HostBoard, joining: bool, say: Callable[..., None],
                 changed: asyncio.Event, taken_out: Callable[[str], None], start_timeout_s: float,
                 launcher: str = "local", ssh: SshOptions = SshOptions(), join_secret: str | None = None,
                 discovery_interval_s: float = 1.0, blacklist_cooldown_s: float = 300.0) -> None:
        """`joining`: hosts join by connecting (the board is the source); `taken_out(host)` is
        called when a host leaves the pool for its cooldown (the jobs on it are rescheduled);
        `changed` is set whenever what is usable changed."""
        self.source = source
        self.board = board
        self.joining = joining
        self.say = say
        self.changed = changed
        self.taken_out = taken_out
        self.start_timeout_s = start_timeout_s
        self.launcher = launcher
        self.ssh = ssh
        self.join_secret = join_secret or generate_secret()
        self.discovery_interval_s = discovery_interval_s
        self.blacklist_cooldown_s = blacklist_cooldown_s
        self.url = ""  # the pool's API, which the pool agents it starts dial (set before `start_agents`)
        self.host_agents: Launcher | None = None
        self.launched: set[str] = set()  # hosts whose pool agent this pool started and has not stopped
        self.expected: dict[str, int] = {}  # the hosts the source names (all joined ones when they join)
        self.hosts: dict[str, int] = {}  # the named hosts whose pool agent joined, with their slots
        self.blacklisted: dict[str, float] = {}  # host -> until
        #: When the source first named hosts; until every one named has joined (or --start-timeout
        #: after this), no job is placed: see `gathering`.
        self._named_at: float | None = None
        self._gathered = False

    # ---------------------------------------------------------------- what is usable
    def capacity(self, now: float) -> int:
        return sum(self.usable_hosts(now).values())

    def usable_hosts(self, now: float) -> dict[str, int]:
        return {h: n for h, n in self.hosts.items() if self.blacklisted.get(h, 0) <= now}

    def resources(self) -> dict[str, dict[str, float]]:
        """What each usable host declares besides its slots (its pool agent says it)."""
        declared = self.board.find_resources()
        return {h: declared.get(h, {}) for h in self.hosts}

    def resource_totals(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for declared in self.resources().values():
            for name, amount in declared.items():
                totals[name] = totals.get(name, 0.0) + amount
        return totals

    def every_host_joined(self) -> bool:
        return bool(self.expected) and set(self.hosts) == set(self.expected)

    def named(self, expected: dict[str, int], now: float) -> None:
        self.expected = expected
        if expected and self._named_at is None:
            self._named_at = now

    def gathering(self, now: float) -> list[str]:
        """The hosts the source named whose pool agent has not joined yet, while the pool starts
        (or takes over): until each has (or is out of the pool) or --start-timeout passed since
        they were named, no job is placed. Else the first host to join would take the first job
        whole at its minimum, and the stability rule (--min-resize-interval) would hold it there
        while the other hosts joined a moment later stood idle. Hosts that join by connecting
        (`--hosts-from-agents`) are named by joining: nothing to wait for."""
        if self._gathered or self.joining or self._named_at is None:
            return []
        missing = sorted(h for h in self.expected if h not in self.hosts and self.blacklisted.get(h, 0) <= now)
        if not missing or now - self._named_at >= self.start_timeout_s:
            self._gathered = True
            return []
        return missing

    def blacklisted_note(self, now: float) -> str:
        """What a waiting job's reason adds while hosts are out of the pool after failures."""
        out = sorted((until, host) for host, until in self.blacklisted.items() if until > now)
        if not out:
            return ""
        named = ", ".join(f"{host} for {until - now:.0f} s" for until, host in out[:5])
        return f" ({len(out)} host(s) out of the pool after failures: {named}{' ...' if len(out) > 5 else ''})"

    def take_out(self, host: str, now: float) -> None:
        """A host failed: out of the pool for --blacklist-cooldown, every job on it rescheduled at
        once (not held by the interval between resizes)."""
        self.blacklisted[host] = now + self.blacklist_cooldown_s
        self.taken_out(host)
        self.changed.set()

    def in_pool(self, host: str, now: float) -> bool:
        """A host the pool has and has not taken out."""
        return host in self.hosts and self.blacklisted.get(host, 0) <= now

    # ---------------------------------------------------------------- the pool agents
    def start_agents(self) -> None:
        """A launcher of pool agents on the named hosts, where this pool starts them."""
        if not self.joining and self.launcher in HOST_AGENT_LAUNCHERS:
            self.host_agents = pool_agent_launcher(
                self.launcher, self.url, self.join_secret, lambda host: self.expected.get(host, 1), self.ssh,
                on_event=lambda host, how: self.say(Kind.POOL_HOST_AGENT_STARTING, host=host, how=how))

    async def stop_agents(self) -> None:
        if self.host_agents is not None:
            await asyncio.to_thread(self.host_agents.stop_all, HOST_AGENTS_STOP_S)

    async def poll(self, stopping: Callable[[], bool]) -> None:
        """The hosts the source names, their pool agents started and stopped to match (when this
        pool starts them), and the pool's hosts: those whose pool agent has joined."""
        last_error = None
        while True:
            try:
                expected = await asyncio.to_thread(self.source.find_hosts)
            except DiscoveryError as exc:
                if str(exc) != last_error:
                    last_error = str(exc)
                    self.say(Kind.DISCOVERY_FAILED, error=last_error)
            else:
                last_error = None
                self.named(expected, time.time())
            if self.host_agents is not None:
                self._start_host_agents(time.time(), stopping())
            joined = self.board.find_hosts()
            hosts = {h: min(n, joined[h]) for h, n in self.expected.items() if h in joined}
            if hosts != self.hosts:
                self.hosts = hosts
                self.say(Kind.POOL_HOSTS, hosts=",".join(f"{h}:{n}" for h, n in hosts.items()) or "(none)",
                         slots=sum(hosts.values()))
                self.changed.set()
            await asyncio.sleep(self.discovery_interval_s)

    async def watch_own_stalls(self) -> None:
        """Let hosts whose pool agent went silent leave, but first find the time the pool itself
        did not run (a SIGSTOP, swapping, a starved machine, a long blocking call): hosts polled
        meanwhile, so the board does not count it as their silence, and it is said. Else every
        host would leave the pool after a long enough stall, and every job on them would lose
        them (as the rendezvous judges its hosts, `host_pool`). One task does both, in that order."""
        probed = time.monotonic()
        while True:
            await asyncio.sleep(STALL_PROBE_S)
            now = time.monotonic()
            late, probed = now - probed - STALL_PROBE_S, now
            if late > STALL_S:
                self.board.stalled(late)
                self.say(Kind.POOL_STALLED, seconds=late)
            for host in self.board.lapse(time.time()):
                self.say(Kind.POOL_HOST_LAPSED, host=host, timeout_s=self.board.timeout_s)
                self.changed.set()

    def _start_host_agents(self, now: float, stopping: bool) -> None:
        """A pool agent on each named host (not while it is out of the pool), none on the others;
        one that ended keeps its host out for --blacklist-cooldown, then is started again."""
        launcher = self.host_agents
        assert launcher is not None
        for host, how in launcher.ended():
            self.launched.discard(host)
            if host in self.expected and not stopping:
                self.say(Kind.POOL_HOST_AGENT_ENDED, host=host, how=how[:500], cooldown_s=self.blacklist_cooldown_s)
                self.take_out(host, now)
        for host in sorted(set(self.expected) - self.launched):
            if self.blacklisted.get(host, 0) <= now:
                launcher.start(host)
                self.launched.add(host)
        for host in sorted(self.launched - set(self.expected)):
            launcher.stop(host)  # its stdin closes: it drains its jobs off the host, then leaves
            self.launched.discard(host)
