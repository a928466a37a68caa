"""Liveness of agents as store leases: the store, not the rendezvous' clock, decides when a
silent host is dead.

Each connected agent has a key `agents/HOST` bound to its own lease; the rendezvous refreshes
the lease on the agent's heartbeats. An agent that stops heartbeating (stopped, partitioned)
loses its key when the lease expires on the store's clock; a watch on `agents/` reports that,
and the watch is resumed from the last revision it saw (re-reading the keys if the store
compacted that history).

Only a running rendezvous refreshes leases, so while none runs every agent's lease runs out,
the living ones' too. A new leader therefore adopts the leases the old one left only to revoke
them when their agents reconnect; their expiry says nothing, and the coordinator's reconnect
window (a fresh heartbeat timeout from the resume) decides which hosts are gone.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Callable

from ringmaster.common.events import Kind, emitter
from ringmaster.common.logs import STORE
from ringmaster.rendezvous.state.kv import KeyValueStore, RevisionCompacted, StoreUnavailable

_say = emitter(STORE)

#: Seconds between two attempts to watch an unreachable store.
RETRY_S = 0.5


class AgentLeases:
    """`ttl_s`: the silence after which a host is lost, asked again at each grant (a large job
    stretches its agents' heartbeats, `heartbeat_pace`): a lease granted shorter than what is
    asked now is granted again at the host's next heartbeat."""

    def __init__(self, store: KeyValueStore, prefix: str, ttl_s: float | Callable[[], float],
                 on_expired: Callable[[str], None]) -> None:
        self.store = store
        self.prefix = prefix + "agents/"
        self._ttl = ttl_s if callable(ttl_s) else (lambda: ttl_s)
        self.on_expired = on_expired
        self.leases: dict[str, int] = {}
        self._granted: dict[str, tuple[int, int]] = {}  # host -> (its lease's ttl, its agent's pid)
        self._refreshed: dict[str, float] = {}
        self._written: dict[str, int] = {}  # revision of each host's current key
        self._inherited: dict[str, int] = {}  # leases a previous leader granted: revoked, never watched

    async def adopt(self) -> set[str]:
        """Take over the leases a previous leader granted; returns the hosts that still have one.

        Their expiry is not reported (nobody refreshed them while no rendezvous ran): the
        agent's reconnection replaces its lease, and a host whose agent does not come back is
        lost by the coordinator's heartbeat timeout."""
        entries, _ = await self.store.get_prefix(self.prefix)
        for entry in entries:
            lease = entry.value.get("lease")
            if isinstance(lease, int):
                self._inherited[entry.key.removeprefix(self.prefix)] = lease
        return set(self._inherited)

    @property
    def ttl_s(self) -> int:
        return max(2, math.ceil(self._ttl()))

    async def connected(self, host: str, pid: int) -> None:
        old = self.leases.pop(host, None) or self._inherited.pop(host, None)
        try:
            if old is not None:
                await self.store.revoke_lease(old)
            ttl = self.ttl_s
            lease = await self.store.grant_lease(ttl)
            revision = await self.store.put(self.prefix + host, {"pid": pid, "lease": lease}, lease=lease)
            self.leases[host], self._written[host], self._granted[host] = lease, revision, (ttl, pid)
            self._refreshed[host] = time.monotonic()
        except StoreUnavailable as exc:
            _say(Kind.AGENT_LEASE_FAILED, host=host, error=str(exc))

    async def heartbeat(self, host: str) -> None:
        lease = self.leases.get(host)
        now = time.monotonic()
        ttl, pid = self._granted.get(host, (self.ttl_s, 0))
        if lease is not None and ttl < self.ttl_s:
            await self.connected(host, pid)  # the job's pace stretched past this lease
            return
        if lease is None or now - self._refreshed.get(host, 0.0) < ttl / 4:
            return
        self._refreshed[host] = now
        try:
            await self.store.refresh_lease(lease)
        except StoreUnavailable:
            pass  # the leader's own refreshes report the store's state

    async def disconnected(self, host: str) -> None:
        self._granted.pop(host, None)
        lease = self.leases.pop(host, None)
        if lease is not None:
            try:
                await self.store.revoke_lease(lease)
            except StoreUnavailable:
                pass  # it expires by itself

    async def watch(self) -> None:
        """Report agents whose key vanished while we held their lease (expired)."""
        revision = None
        while True:
            try:
                if revision is None:
                    _, revision = await self.store.get_prefix(self.prefix)
                    revision += 1
                async for change in self.store.watch_prefix(self.prefix, revision):
                    revision = change.revision + 1
                    host = change.key.removeprefix(self.prefix)
                    if change.value is None and host in self.leases and change.revision > self._written.get(host, 0):
                        del self.leases[host]
                        self.on_expired(host)
            except RevisionCompacted:
                revision = None
            except StoreUnavailable:
                await asyncio.sleep(RETRY_S)
