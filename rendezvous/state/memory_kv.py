"""The embedded store: etcd's semantics (revisions, leases, watches) in one process's memory.

Its history is compacted as etcd's is: past `HISTORY_KEPT` changes, the oldest half goes, and
a watch that had not read them is told so (`RevisionCompacted`: it reads the keys again). A
long job on the default store would otherwise keep every change it ever made in memory.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from typing import Any, AsyncIterator, Callable

from ringmaster.rendezvous.state.kv import Change, Entry, RevisionCompacted

#: Changes kept for watches (compacted to half of it when it is reached).
HISTORY_KEPT = 200_000


class MemoryStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._data: dict[str, tuple[dict[str, Any], int, int | None]] = {}  # key -> value, mod_revision, lease
        self._revision = 1
        self._history: list[Change] = []
        self._leases: dict[int, tuple[float, int]] = {}  # id -> expiry, ttl
        self._lease_keys: dict[int, set[str]] = {}  # id -> the keys bound to it
        self._lease_ids = itertools.count(1)
        #: No lease expires before this (a bound: refreshes only move expiries later), so the
        #: expiry check that every call makes looks at the leases only when one may have expired.
        self._earliest_expiry = float("inf")
        self._changed = asyncio.Event()  # set, and replaced, on every change
        self._compacted = 0

    # ------------------------------------------------------------ keys
    async def get_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        await self._expire()
        entries = [Entry(k, dict(v), rev) for k, (v, rev, _) in sorted(self._data.items()) if k.startswith(prefix)]
        return entries, self._revision

    async def put(self, key: str, value: dict[str, Any], lease: int | None = None) -> int:
        await self._expire()
        return await self._write(key, value, lease)

    async def put_if(self, key: str, value: dict[str, Any], mod_revision: int, lease: int | None = None) -> bool:
        await self._expire()
        current = self._data.get(key)
        if (current[1] if current else 0) != mod_revision:
            return False
        await self._write(key, value, lease)
        return True

    async def transact(self, guards: dict[str, int], puts: dict[str, dict[str, Any]], deletes: list[str],
                       lease: int | None = None) -> bool:
        await self._expire()
        for key, revision in guards.items():
            current = self._data.get(key)
            if (current[1] if current else 0) != revision:
                return False
        if lease is not None and lease not in self._leases:
            raise ValueError(f"lease {lease} has expired or was never granted")
        for key, value in puts.items():
            await self._write(key, value, lease)
        await self._remove([key for key in deletes if key in self._data])
        return True

    async def delete(self, key: str) -> None:
        await self._expire()
        if key in self._data:
            await self._remove([key])

    # ------------------------------------------------------------ leases
    async def grant_lease(self, ttl_s: int) -> int:
        lease = next(self._lease_ids)
        self._leases[lease] = (self._clock() + ttl_s, ttl_s)
        self._earliest_expiry = min(self._earliest_expiry, self._clock() + ttl_s)
        return lease

    async def refresh_lease(self, lease: int) -> bool:
        await self._expire()
        if lease not in self._leases:
            return False
        self._leases[lease] = (self._clock() + self._leases[lease][1], self._leases[lease][1])
        return True

    async def revoke_lease(self, lease: int) -> None:
        self._leases.pop(lease, None)
        await self._remove(sorted(self._lease_keys.pop(lease, ())))

    # ------------------------------------------------------------ watches
    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[Change]:
        if start_revision < self._compacted:
            raise RevisionCompacted(self._compacted)
        seen = start_revision
        while True:
            await self._expire()
            if seen < self._compacted:
                raise RevisionCompacted(self._compacted)
            changed = self._changed  # taken before reading, so no change slips between
            newer = self._history[bisect.bisect_left(self._history, seen, key=lambda c: c.revision):]
            pending = [c for c in newer if c.key.startswith(prefix)]
            looked_upto = newer[-1].revision + 1 if newer else seen  # (matching or not: not looked at again)
            for change in pending:
                yield change
                seen = change.revision + 1
            seen = max(seen, looked_upto)
            deadline = time.monotonic() + 0.2  # lease expiry needs no writer: look again soon
            while not changed.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

    async def compact(self, revision: int) -> None:
        """Drop history below `revision` (as etcd's compaction does), for watch resumption tests."""
        self._history = [c for c in self._history if c.revision >= revision]
        self._compacted = revision

    async def close(self) -> None:
        pass

    # ------------------------------------------------------------ internals
    async def _write(self, key: str, value: dict[str, Any], lease: int | None) -> int:
        if lease is not None and lease not in self._leases:
            raise ValueError(f"lease {lease} has expired or was never granted")
        self._revision += 1
        self._unbind(key)
        self._data[key] = (dict(value), self._revision, lease)
        if lease is not None:
            self._lease_keys.setdefault(lease, set()).add(key)
        await self._notify(Change(key, dict(value), self._revision))
        return self._revision

    async def _remove(self, keys: list[str]) -> None:
        for key in keys:
            self._revision += 1
            self._unbind(key)
            del self._data[key]
            await self._notify(Change(key, None, self._revision))

    def _unbind(self, key: str) -> None:
        """Forget `key`'s lease binding (it is written again or removed)."""
        current = self._data.get(key)
        if current is not None and current[2] is not None:
            self._lease_keys.get(current[2], set()).discard(key)

    async def _notify(self, change: Change) -> None:
        self._history.append(change)
        if len(self._history) >= HISTORY_KEPT:
            await self.compact(self._history[HISTORY_KEPT // 2].revision)
        self._changed.set()
        self._changed = asyncio.Event()

    async def _expire(self) -> None:
        now = self._clock()
        if now < self._earliest_expiry:
            return
        for lease, (expiry, _) in list(self._leases.items()):
            if expiry <= now:
                await self.revoke_lease(lease)
        self._earliest_expiry = min((expiry for expiry, _ in self._leases.values()), default=float("inf"))

