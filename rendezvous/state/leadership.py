"""One leader per job: the rendezvous process that holds the job's `leader` key.

The key is created only if absent and is bound to a short lease that the leader refreshes, so
etcd itself removes it (on its own clock) a few seconds after the leader dies; a standby that
sees it gone takes over. Every write of the leader is a transaction guarded by the leader key's
`mod_revision` (see `guard`), so a leader that lost its key can no longer change the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Callable

from ringmaster.common.errors import StateError
from ringmaster.common.events import Kind, emitter
from ringmaster.common.logs import STORE
from ringmaster.rendezvous.state.kv import KeyValueStore, StoreUnavailable

_say = emitter(STORE)

#: Seconds a dead leader's key outlives it; a standby takes over about this long after.
DEFAULT_LEADER_TTL_S = 3


class AnotherLeader(StateError):
    """The job already has a live leader (for `ringmaster run`, which does not wait as standby)."""


class Leadership:
    def __init__(self, store: KeyValueStore, prefix: str, address: str, ttl_s: int = DEFAULT_LEADER_TTL_S,
) -> None:
        self.store = store
        self.key = prefix + "leader"
        self.address = address
        self.ttl_s = ttl_s
        self.revision = 0  # mod_revision of our leader key, once held
        self.lease: int | None = None
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self._retaking = asyncio.Lock()  # the lease refresher and the journal may both find the key gone

    @property
    def guard(self) -> dict[str, int]:
        """Compare this in every transaction: it holds only while we lead."""
        return {self.key: self.revision}

    async def acquire(self, wait: bool) -> None:
        """Become the leader; with `wait`, stand by until the current leader is gone."""
        announced = None
        while True:
            lease = await self.store.grant_lease(self.ttl_s)
            value = {"address": self.address, "pid": os.getpid()}
            if await self.store.put_if(self.key, value, 0, lease=lease):
                entries, _ = await self.store.get_prefix(self.key)
                self.revision = next(e.mod_revision for e in entries if e.key == self.key)
                self.lease = lease
                return
            await self.store.revoke_lease(lease)
            current = await self._current()
            if not wait:
                raise AnotherLeader(
                    f"the job under this --store prefix is led by the rendezvous at {current or 'another process'}; "
                    "give this job another prefix (etcd://HOST:PORT/PREFIX) or stop the other one"
                )
            if current != announced:
                _say(Kind.LEADER_STANDING_BY, leader=current)
                announced = current
            await asyncio.sleep(self.ttl_s / 3)

    async def keep(self, on_store_trouble: Callable[[str | None], None]) -> None:
        """Refresh the lease until it is lost; `on_store_trouble(message)` on a failed refresh,
        `on_store_trouble(None)` when refreshes work again."""
        assert self.lease is not None
        while not self.lost.is_set():
            await asyncio.sleep(self.ttl_s / 3)
            try:
                alive = await self.store.refresh_lease(self.lease)
            except StoreUnavailable as exc:
                on_store_trouble(str(exc))
                continue
            on_store_trouble(None)
            if not alive and not await self.still_leading():
                self.depose("its leader lease expired in the store (the store was unreachable, or this process "
                            "was stopped, too long) and another rendezvous took the job over")

    async def still_leading(self) -> bool:
        """A guarded write failed: is the leader key ours (taken again since), or free (then take
        it again), or another rendezvous's?"""
        async with self._retaking:
            try:
                entries, _ = await self.store.get_prefix(self.key)
            except StoreUnavailable:
                return False
            held = next((e for e in entries if e.key == self.key), None)
            if held is None:
                return await self._lead_again()
            return held.mod_revision == self.revision and not self.lost.is_set()

    async def _lead_again(self) -> bool:
        """Our lease ran out (the store was out of reach, or this process did not run). If nobody
        took the leader key meanwhile, nobody led the job: take it again and go on leading.
        Otherwise another rendezvous leads: step down."""
        try:
            lease = await self.store.grant_lease(self.ttl_s)
            value = {"address": self.address, "pid": os.getpid()}
            if not await self.store.put_if(self.key, value, 0, lease=lease):
                await self.store.revoke_lease(lease)
                return False
            entries, _ = await self.store.get_prefix(self.key)
        except StoreUnavailable:
            return False
        self.revision = next(e.mod_revision for e in entries if e.key == self.key)
        self.lease = lease
        _say(Kind.LEADER_LEADING_ON)
        return True

    async def announce(self, address: str) -> None:
        """Publish the address we listen on (known once the port is bound)."""
        self.address = address
        value = {"address": address, "pid": os.getpid()}
        if not await self.store.put_if(self.key, value, self.revision, lease=self.lease):
            self.depose("the leader key changed before the rendezvous started")
            return
        entries, _ = await self.store.get_prefix(self.key)
        self.revision = next(e.mod_revision for e in entries if e.key == self.key)

    def depose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()

    async def resign(self) -> None:
        if self.lease is not None:
            with contextlib.suppress(StoreUnavailable):
                await self.store.revoke_lease(self.lease)
            self.lease = None

    async def _current(self) -> str | None:
        entries, _ = await self.store.get_prefix(self.key)
        return next((str(e.value.get("address")) for e in entries if e.key == self.key), None)
