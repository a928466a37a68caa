"""The hosts a job runs on, apart from the job: where they come from, whether their agents live,
which are blacklisted, and which want an agent started.

`HostPool` knows hosts, never workers or generations. Discovery's host sets, agents' sessions
and heartbeats, and what launchers say come in as inputs; what needs a decision of the job (an
agent connected, a host lost, a host whose agent could not be started) goes out as facts
(`facts`) through `observe`, in the order it happened, and what must be done to hosts (start an
agent, stop one) goes out as effects (`effects.LaunchAgent`, `effects.StopLaunchedAgent`). Its
clock also judges the rendezvous itself: a stall (it did not run) or an isolation (every host
fell silent at once) means nobody is judged by silence.

The host set is what discovery lists (`set_hosts`) together with, under `--hosts-from-agents`,
the hosts whose agents joined by connecting with the slots they declared (`agent_connected`):
such a host leaves the set when its agent goes (exits, drains, is lost), and the change goes to
the job as a `HostsJoined` fact, as discovery's changes do through `set_hosts`.

Pure like the coordinator: no I/O, the time is passed in. Nothing here assumes a single job:
a job asks for the hosts it may use (`eligible_hosts`, `capacity`, `hosts_wanted`) and tells
the pool when one of its hosts failed (`blacklist_host`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import AbstractSet, Callable, Mapping

from ringmaster import __version__
from ringmaster.common.events import Event, Kind
from ringmaster.common.reconnect import LONGEST_GAP_S
from ringmaster.discovery import Blacklist, CooldownRange, HostDiff, diff_hosts
from ringmaster.rendezvous.control.effects import LaunchAgent, PoolEffect, StopLaunchedAgent
from ringmaster.rendezvous.control.facts import AgentConnected, AgentLost, AgentUnreachable, Fact, HostsJoined
from ringmaster.rendezvous.control.heartbeat_pace import Pace, pace
from ringmaster.rendezvous.control.records import Host, recorded_changes
from ringmaster.settings import JobSettings

#: Seconds after which a host that is neither discovered nor connected, and runs no worker, is
#: forgotten (it leaves `/status` and the store): agents that said hello and vanished do not
#: pile up.
FORGET_DEPARTED_HOST_S = 60.0
#: A gap this long between two ticks (which come every fraction of a second), beyond the gap the
#: clock planned (`HostPool.tick_every_s`), means the rendezvous itself did not run: stopped
#: (SIGSTOP), swapped out, starved of CPU.
STALL_S = 1.5

Emit = Callable[..., Event]


@dataclass(frozen=True)
class Liveness:
    """What one tick found about the rendezvous itself: `stalled` or `rejoined` (everyone gets a
    fresh heartbeat window: it was deaf, they were not dead), or `isolated` (judge nobody)."""

    stalled: bool = False
    rejoined: bool = False
    isolated: bool = False


class HostPool:
    def __init__(self, settings: JobSettings, emit: Emit, observe: Callable[[Fact], None],
                 blacklist: Blacklist | None = None, launches_agents: bool = False) -> None:
        """`emit(now, kind, **fields)` tells an event; `observe(fact)` hands a fact to the job;
        with `launches_agents`, the pool asks for the agents of the hosts the job wants."""
        self.settings = settings
        self._emit = emit
        self._observe = observe
        cooldown = CooldownRange(*settings.blacklist_cooldown_s) if settings.blacklist_cooldown_s else None
        self.blacklist = blacklist or Blacklist(cooldown)
        self.launches_agents = launches_agents
        #: The heartbeat intervals asked of agents and workers (answered to each heartbeat), and the
        #: silences after which each is dead: the configured ones, stretched with the job's size
        #: (`repace`, `heartbeat_pace`). This pool is their one owner.
        self.pace: Pace = pace(settings.heartbeat_interval_s, settings.heartbeat_timeout_s, 0, 0,
                               settings.heartbeat_relay)
        self.hosts: dict[str, Host] = {}
        self.first_discovery_at: float | None = None
        self.last_tick: float | None = None
        #: Seconds the rendezvous' clock planned until its next tick: a large job's ticks are
        #: spaced by their cost (the server's TICK_DUTY), and a planned gap is no stall.
        self.tick_every_s = 0.0
        self.stall_ended_at: float | None = None  # when the rendezvous last came back from a stall
        self.isolated_since: float | None = None  # when every host fell silent at once (see `_isolated`)
        self.effects: list[PoolEffect] = []  # agents to start or stop, taken by the server
        self._order: list[str] = []  # discovery's order (Horovod's): lower ranks go to older hosts
        self._eligible: tuple[tuple[float, int, int, int], list[str], list[Host]] | None = None  # (`eligible_hosts`)
        self._slots_hint: list[str] = []  # hosts that had the slots `has_slots_besides` last looked for
        self._kept_hint = ""  # a discovered host not blacklisted, the last time `blacklist_host` looked
        self._listed: dict[str, int] = {}  # discovery's latest host set
        self._joined: dict[str, int] = {}  # hosts whose agents joined by connecting, with their slots
        self._blacklisted_for: dict[str, str] = {}  # host -> the failure that blacklisted it
        self._launched: dict[str, bool] = {}  # host -> whether the agent started for it connected since
        self._stopping: set[str] = set()  # launched agents asked to stop

    # ------------------------------------------------------------------ inputs: discovery
    def repace(self, workers: int) -> None:
        """Stretch heartbeat intervals (and the silences that count as death) with the job's size:
        `workers` live ones. Hosts discovered count before their agents connect: the first agents in
        are asked for the job's pace from their first answer, not for 1 s beats that wait behind
        everyone's hellos."""
        hosts = sum(1 for h in self.hosts.values() if h.agent_connected or h.discovered)
        self.pace = pace(self.settings.heartbeat_interval_s, self.settings.heartbeat_timeout_s, hosts, workers,
                         self.settings.heartbeat_relay)

    def set_hosts(self, hosts: Mapping[str, int], now: float) -> HostDiff | None:
        """Discovery's latest good host set; the change, or None for the first one."""
        self._listed = dict(hosts)
        if self.first_discovery_at is None:
            self.first_discovery_at = now
            self._emit(now, Kind.HOSTS_DISCOVERED, hosts=dict(hosts))
            self._apply_host_set(now, said=True)
            return None
        return self._apply_host_set(now)

    def host_set(self) -> dict[str, int]:
        """The hosts in the set now, with their slots: discovery's, then those agents joined
        (discovery's slots win for a host that is both)."""
        return {**self._joined, **self._listed}

    def _apply_host_set(self, now: float, said: bool = False) -> HostDiff | None:
        """Bring the hosts' records in line with the host set; the change (said as an event
        unless `said`), or None when there is none."""
        old = {h.name: h.slots for h in self.hosts.values() if h.discovered}
        hosts = self.host_set()
        change = diff_hosts(old, hosts)
        if change and not said:
            self._emit(now, Kind.HOSTS_CHANGED, description=change.describe(), added=dict(change.added),
                       removed=list(change.removed), resized={h: list(ab) for h, ab in change.resized.items()})
        for name, slots in hosts.items():
            host = self.hosts.get(name)
            if host is None:
                host = self.hosts[name] = Host(name, slots)
            joined = name in self._joined and name not in self._listed
            # (only what changed: a record set is a record to save again, for each of 4,096 hosts)
            if host.slots != slots or not host.discovered or host.joined != joined:
                host.slots, host.discovered, host.joined = slots, True, joined
        for name in old:
            if name not in hosts:
                self.hosts[name].discovered = self.hosts[name].joined = False
        known = set(self._order)  # (a list's `in` made this quadratic: 0.2 s for 64 hosts added to 4,096)
        self._order = [n for n in self._order if n in hosts] + [n for n in hosts if n not in known]
        return change or None

    def _join(self, host: str, slots: int, now: float) -> None:
        """`--hosts-from-agents`: the agent of `host` joined with `slots` (0: it left)."""
        if slots > 0:
            self._joined[host] = slots
        elif self._joined.pop(host, None) is None:
            return
        if self.first_discovery_at is None:
            return  # the first discovery (or a resumed job) brings the rest of the set
        change = self._apply_host_set(now)
        if change:
            self._observe(HostsJoined(change))

    def discovery_failed(self, message: str, now: float) -> None:
        self._emit(now, Kind.DISCOVERY_FAILED, error=message)

    def resumed(self, hosts: dict[str, Host], now: float, agents_survive: bool) -> None:
        """Carry on with the hosts a previous rendezvous kept: each gets a fresh heartbeat
        window to reconnect (their last heartbeats were on the old process's clock; see
        `Coordinator.resume` for `LONGEST_GAP_S`), and a drain under way its whole deadline again
        (read back on a clock that starts at 0)."""
        self.hosts = hosts
        self.first_discovery_at = now
        self._joined = {h.name: h.slots for h in hosts.values() if h.joined and h.discovered}
        self._listed = {h.name: h.slots for h in hosts.values() if h.discovered and not h.joined}
        self._order = [h.name for h in hosts.values() if h.discovered]
        for host in hosts.values():
            host.agent_connected = host.agent_connected and agents_survive
            host.last_heartbeat = now + LONGEST_GAP_S
            if host.drain is not None:
                host.drain = replace(host.drain, requested_at=host.drain.requested_at + now,
                                     deadline_at=host.drain.deadline_at + now)

    # ------------------------------------------------------------------ inputs: agents
    def agent_connected(self, host: str, pid: int, now: float, running: list[str] | None = None,
                        incarnation: str = "", slots: int = 0, version: str | None = None) -> None:
        """An agent opened its session; `running` names the workers it runs (a reconnecting
        agent's workers that are not among them died while it was away). Under
        `--hosts-from-agents` its host joins the host set with the `slots` it declared. An agent
        of another Ringmaster `version` than the rendezvous's is warned of (once per connection,
        both named): mixed versions may disagree on what the messages mean, which is an upgrade
        half done rather than a reason to refuse a host."""
        record = self.hosts.setdefault(host, Host(host, 0, discovered=False))
        again = record.agent_connected and record.agent_pid == pid
        record.agent_connected, record.agent_pid, record.last_heartbeat = True, pid, now
        record.agent_incarnation = incarnation
        if host in self._launched:
            self._launched[host] = True
        self._emit(now, Kind.AGENT_RECONNECTED if again else Kind.AGENT_CONNECTED, host=host, pid=pid)
        if version is not None and version != __version__ and not again:
            self._emit(now, Kind.AGENT_VERSION_DIFFERS, host=host,
                       agent_version=version or "(older than 0.2.0: none sent)",
                       version=__version__)
        self._observe(AgentConnected(host, frozenset(running or ()), incarnation))
        if self.settings.hosts_from_agents and slots > 0:
            self._join(host, slots, now)

    def agent_launch_failed(self, host: str, reason: str, now: float) -> None:
        """The agent of `host` could not be started (its ssh exited before the agent connected):
        the host counts as failed, by the blacklist's rules."""
        if host in self.hosts:
            self._observe(AgentUnreachable(host, reason))

    def agent_process_ended(self, host: str, how: str, now: float) -> None:
        """A launcher says the agent it started for `host` ended (`how`, with what it printed).
        One that never connected means the host cannot be reached, unless it was asked to stop
        (its host left before it connected, or before it was even started)."""
        connected = self._launched.pop(host, False)
        stopped = host in self._stopping
        self._stopping.discard(host)
        record = self.hosts.get(host)
        if not connected and not stopped and record is not None and not record.agent_connected:
            self.agent_launch_failed(host, how, now)

    def agent_heartbeat(self, host: str, now: float) -> None:
        if host in self.hosts:
            self.hosts[host].last_heartbeat = now

    def agent_disconnected(self, host: str, now: float, reason: str = "closed its connection",
                           silent: bool = False) -> None:
        """The host's agent is gone: its session closed, or (`silent`) it stopped answering
        without closing it, as a host cut off by a partition (or frozen) does."""
        record = self.hosts.get(host)
        if record is None or not record.agent_connected:
            return
        record.agent_connected = False
        self._observe(AgentLost(host, reason, silent))
        self._join(host, 0, now)  # a host that joined by connecting leaves with its agent

    # ------------------------------------------------------------------ the clock
    def tick(self, now: float) -> Liveness:
        """Judge the rendezvous itself, then the hosts by their heartbeats (unless isolated)."""
        stalled = self.last_tick is not None and now - self.last_tick > STALL_S + self.tick_every_s
        if stalled:
            assert self.last_tick is not None
            self._after_stall(now, now - self.last_tick)
        self.last_tick = now
        was_isolated = self.isolated_since is not None
        isolated = self._isolated(now)
        rejoined = was_isolated and self.isolated_since is None
        timeout = self.pace.agent_timeout_s
        for host in self.hosts.values():
            if not isolated and host.agent_connected and now - host.last_heartbeat > timeout:
                self.agent_disconnected(host.name, now, f"sent no heartbeat for {now - host.last_heartbeat:.1f} s",
                                        silent=True)
        return Liveness(stalled, rejoined, isolated)

    def _isolated(self, now: float) -> bool:
        """Every connected host (two or more) fell silent at once: more likely this rendezvous is
        cut off than all of them died, and training needs no rendezvous. Nobody is judged by
        silence then (hosts nor workers); once the first host is past the timeout the rendezvous
        says it waits, up to `reconnect_timeout_s` (the agents fence themselves after that long
        without us), then judges as usual. When anyone is heard again, everyone gets a fresh
        window, so hosts whose heartbeats come back a moment later are not counted lost."""
        if self.all_silent(now):
            connected = [h for h in self.hosts.values() if h.agent_connected]
            if self.isolated_since is None:
                if not any(now - h.last_heartbeat > self.pace.agent_timeout_s for h in connected):
                    return True  # silent together, not yet for long: judge nobody
                self.isolated_since = max(h.last_heartbeat for h in connected)
                self._emit(now, Kind.RENDEZVOUS_ISOLATED, hosts=len(connected), seconds=now - self.isolated_since,
                           wait_s=self.settings.reconnect_timeout_s)
            return now - self.isolated_since < self.settings.reconnect_timeout_s
        if self.isolated_since is not None:
            self._emit(now, Kind.RENDEZVOUS_REJOINED, seconds=now - self.isolated_since)
            self.isolated_since = None
            for host in self.hosts.values():
                host.last_heartbeat = max(host.last_heartbeat, now)
        return False

    def _lately(self) -> float:
        """Hosts beat every interval, so a partition silences them within about one interval of
        each other: "at once" means none was heard for this long."""
        return min(2 * self.pace.agent_s, self.pace.agent_timeout_s / 2)

    def all_silent(self, now: float) -> bool:
        """Two or more hosts connected, and none heard lately (see `_isolated`)."""
        connected = [h for h in self.hosts.values() if h.agent_connected]
        return len(connected) >= 2 and now - max(h.last_heartbeat for h in connected) > self._lately()

    def waiting_out_isolation(self, now: float) -> bool:
        """Is the rendezvous waiting, or about to wait, for hosts that all fell silent at once
        (see `_isolated`)? A store lease that runs out meanwhile says nothing of its agent."""
        if self.isolated_since is not None:
            return now - self.isolated_since < self.settings.reconnect_timeout_s
        return self.all_silent(now)

    def stalled_recently(self, now: float, window_s: float) -> bool:
        """Is the rendezvous stalled right now (no tick for STALL_S), or did it come back from a
        stall less than `window_s` ago? Then a lease that ran out says nothing of its agent."""
        if self.last_tick is not None and now - self.last_tick > STALL_S + self.tick_every_s:
            return True
        return self.stall_ended_at is not None and now - self.stall_ended_at < window_s

    def _after_stall(self, now: float, gap: float) -> None:
        """The rendezvous did not run for `gap` seconds: it was deaf, the hosts were not dead."""
        self.stall_ended_at = now
        self._emit(now, Kind.RENDEZVOUS_STALLED, seconds=gap)
        for host in self.hosts.values():
            host.last_heartbeat = max(host.last_heartbeat, now)

    def forget_departed(self, now: float, busy: AbstractSet[str]) -> list[str]:
        """Forget hosts neither discovered nor connected that run nothing (`busy`: the hosts
        with live workers) and were not heard for FORGET_DEPARTED_HOST_S; their names."""
        gone = [name for name, host in self.hosts.items()
                if not host.discovered and not host.agent_connected and name not in busy
                and now - host.last_heartbeat > FORGET_DEPARTED_HOST_S]
        for name in gone:
            del self.hosts[name]
        return gone

    # ------------------------------------------------------------------ the blacklist
    def is_blacklisted(self, host: str, now: float) -> bool:
        return self.blacklist.is_blacklisted(host, now)

    def blacklist_host(self, host: str, why: str, now: float) -> str | None:
        """Keep `host` out (for good, or for its cooldown). When every discovered host is out
        then, why each is (the job cannot go on); else None."""
        cooldown = self.blacklist.record_failure(host, now)
        self._blacklisted_for[host] = why
        self._emit(now, Kind.HOST_BLACKLISTED, host=host, cooldown_s=None if cooldown == float("inf") else cooldown,
                   why=why)
        out = self.blacklist.is_blacklisted
        kept = self.hosts.get(self._kept_hint)  # (the one found last time first: a rack lost is one call a host)
        if kept is None or not kept.discovered or out(kept.name, now):
            kept = next((h for h in self.hosts.values() if h.discovered and not out(h.name, now)), None)
        if kept is not None:
            self._kept_hint = kept.name
            return None
        discovered = [h for h in self.hosts.values() if h.discovered]
        return "; ".join(f"{h.name}: {self._blacklisted_for.get(h.name, 'failed')}" for h in discovered) or None

    # ------------------------------------------------------------------ what a job may use
    def joined_hosts(self) -> int:
        """Hosts in the set because their agents joined by connecting."""
        return len(self._joined)

    def ordered_hosts(self) -> list[Host]:
        """Hosts in the set in discovery's order: hosts known longer first, new ones in the order
        listed (Horovod's rule), so rank 0 follows `-H` and a host that joins takes the last ranks."""
        order = self._order or [h.name for h in self.hosts.values()]
        return [self.hosts[n] for n in order if n in self.hosts and self.hosts[n].discovered]

    def eligible_hosts(self, now: float) -> list[Host]:
        """Hosts a job may use now: discovered, agent connected, not blacklisted nor drained (in
        order). Shared (do not change it) and kept while nothing it depends on changed: a pass
        asks seven times, each a look at every host."""
        key = (now, recorded_changes(), len(self.hosts), self.blacklist.changes)
        kept = self._eligible
        if kept is None or kept[0] != key or kept[1] is not self._order:
            blacklist = self.blacklist
            hosts = [h for h in self.ordered_hosts() if h.agent_connected and h.drain is None]
            if blacklist.changes:
                hosts = [h for h in hosts if not blacklist.is_blacklisted(h.name, now)]
            kept = self._eligible = (key, self._order, hosts)
        return kept[2]

    def has_slots_besides(self, host: str, needed: int, now: float) -> bool:
        """Whether the hosts a job may use now (`eligible_hosts`' rule) other than `host` have
        `needed` slots, looking at those that had them last time first and stopping once found:
        2,048 hosts of 4,096 lost at once (a rack, a switch) asked this once each, and each was a
        look at every host (2.3 s of one pass)."""
        found: dict[str, None] = {}
        slots = 0
        for name in itertools.chain(self._slots_hint, self._order or self.hosts):  # (not copied: a call a lost host)
            h = self.hosts.get(name)
            if name == host or name in found or h is None or not (h.discovered and h.agent_connected) \
                    or h.drain is not None or self.blacklist.is_blacklisted(name, now):
                continue
            found[name] = None
            slots += h.slots
            if slots >= needed:
                self._slots_hint = list(found)
                return True
        return needed <= 0

    def capacity(self, now: float, limit: int | None) -> int:
        """Slots of the eligible hosts, at most `limit`."""
        slots = sum(h.slots for h in self.eligible_hosts(now))
        return min(slots, limit) if limit is not None else slots

    def hosts_wanted(self, now: float, limit: int | None, busy: AbstractSet[str]) -> list[str]:
        """The hosts a job with at most `limit` workers can use now, in order: usable ones until
        their slots reach the limit (all without one), plus those running its workers (`busy`).
        Only these need an agent: 20 discovered hosts and --max-np 2 start one or two agents."""
        wanted, slots = [], 0
        for host in self.ordered_hosts():
            if self.blacklist.is_blacklisted(host.name, now) or (host.drain is not None and host.name not in busy):
                continue
            if limit is not None and slots >= limit and host.name not in busy:
                continue
            wanted.append(host.name)
            slots += host.slots
        return wanted

    # ------------------------------------------------------------------ launching agents
    def reconcile_agents(self, wanted: list[str], busy: AbstractSet[str]) -> None:
        """With `launches_agents`: ask for an agent on each wanted host that has none started or
        connected, and for the end of launched agents whose hosts left discovery and run nothing."""
        if not self.launches_agents:
            return
        for name in self._launched:
            host = self.hosts.get(name)
            if host is not None and not host.discovered and name not in busy and name not in self._stopping:
                self._stopping.add(name)
                self.effects.append(StopLaunchedAgent(name))
        for name in wanted:
            if self.hosts[name].agent_connected or name in self._launched:
                continue
            self._launched[name] = False
            self.effects.append(LaunchAgent(name))

    def drain(self) -> list[PoolEffect]:
        out, self.effects = self.effects, []
        return out
