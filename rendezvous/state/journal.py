"""Keeps the job's keys in the store equal to the coordinator's record.

Write-ahead: the gRPC layer holds back what the coordinator wants said to agents and workers
until the state that produced it is in the store, so a rendezvous that dies at any moment is
succeeded by one that knows at least everything that was announced. Each save writes only the
keys that changed, in one transaction guarded by the leader key; all keys hang on a job lease
that the leader refreshes, so an abandoned job's keys disappear by themselves.

While the store is unreachable nothing is lost: saves are retried with the newest record, and
training goes on (collectives do not need the rendezvous); only membership changes wait.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ringmaster.common.errors import StateError
from ringmaster.common.events import Kind, emitter
from ringmaster.common.logs import STORE
from ringmaster.rendezvous.control.records import SavedJob
from ringmaster.rendezvous.state import job_record
from ringmaster.rendezvous.state.kv import KeyValueStore, StoreUnavailable
from ringmaster.rendezvous.state.leadership import Leadership

_say = emitter(STORE)

#: Seconds the keys of a job whose rendezvous is gone (and not restarted) are kept.
DEFAULT_JOB_TTL_S = 600
#: Seconds between two attempts to reach an unreachable store.
RETRY_S = 0.5
#: Most writes in one transaction (etcd refuses more than 128 by default: --max-txn-ops).
MAX_TXN_OPS = 100
#: Most transactions of hosts' and workers' keys in flight at once (see `Journal._write`).
MAX_TXN_IN_FLIGHT = 8


def _write_order(key: str) -> int:
    """Where a key goes in a save: the generation and the job's counters last, the runs that say
    its members just before, everything else first."""
    if key == job_record.GENERATION_KEY or key == job_record.JOB_KEY:
        return 2
    return 1 if key.startswith(job_record.MEMBERS) else 0


def _in_flight_together(chunks: list[list[tuple[str, Any]]]) -> list[list[list[tuple[str, Any]]]]:
    """`chunks` (in order) as the groups sent together: runs of up to MAX_TXN_IN_FLIGHT chunks of
    hosts' and workers' keys alone; a chunk with a member run or the generation alone."""
    groups: list[list[list[tuple[str, Any]]]] = []
    for chunk in chunks:
        alone = _write_order(chunk[-1][0]) > 0  # (ops are in write order: the last is the latest kind)
        if alone or not groups or len(groups[-1]) >= MAX_TXN_IN_FLIGHT or _write_order(groups[-1][0][-1][0]) > 0:
            groups.append([chunk])
        else:
            groups[-1].append(chunk)
    return groups


class Deposed(StateError):
    """Another rendezvous leads the job now; this one must stop without touching it."""


class Journal:
    def __init__(self, store: KeyValueStore, prefix: str, leadership: Leadership,
                 job_ttl_s: int = DEFAULT_JOB_TTL_S) -> None:
        self.store = store
        self.state_prefix = prefix + "state/"
        self.leadership = leadership
        self.job_ttl_s = job_ttl_s
        self.lease: int | None = None
        self.saves = 0
        self._written: dict[str, dict[str, Any]] = {}
        self._trouble: str | None = None
        self._snapshots = job_record.Snapshots()  # so `save_job` rebuilds only what changed
        self._rewrite = True  # every key must be compared: `_written` is not what the last save wrote
        self._resets = 0  # times every key had to be written again (a new job lease)

    async def load(self) -> SavedJob | None:
        """The job the store holds (None: a new job); IncompatibleState if it cannot be read.
        Every key is rewritten by the first save, onto this leader's job lease."""
        entries, _ = await self.store.get_prefix(self.state_prefix)
        values = {e.key.removeprefix(self.state_prefix): e.value for e in entries}
        restored = job_record.read_job(values)
        for count, (key, why) in enumerate(restored.skipped if restored is not None else (), start=1):
            _say(Kind.STORE_UNREADABLE, key=key, error=why, count=count)
        self._written = {key: {} for key in values}
        self._rewrite = True
        self.lease = await self.store.grant_lease(self.job_ttl_s)
        return restored

    async def save_job(self, saved: SavedJob) -> float:
        """Build the job's record as it is now (the unchanged keys as built last time) and write
        what changed, as `save` does; returns the seconds the build took on the loop's thread
        (the caller spaces saves by it). The build says which keys it changed, so only those are
        compared with what was written."""
        started = time.perf_counter()
        values = job_record.build_values(saved, self._snapshots)
        cost = time.perf_counter() - started
        await self._write(values, self._snapshots.changed)
        return cost

    async def save(self, values: dict[str, dict[str, Any]]) -> None:
        """Write what changed; retried until the store answers. Raises Deposed.

        A large change goes in several transactions of at most MAX_TXN_OPS writes, each guarded
        by the leader key. The generation's member runs, the generation and the job's counters go
        last, and the last transaction is the fullest: a host lost or added (a few runs) is one
        transaction, and a reader never sees a generation whose members' records are not written yet."""
        await self._write(values, None)

    async def _write(self, values: dict[str, dict[str, Any]], changed: set[str] | None) -> None:
        """`save`, told the keys that can differ from what was written (None: any)."""
        resets = self._resets
        if changed is not None and not self._rewrite:
            written = self._written
            puts = {k: values[k] for k in changed if k in values and written.get(k) != values[k]}
            deletes = [k for k in changed if k not in values and k in written]
        else:
            puts, deletes = job_record.diff(self._written, values)
        if not puts and not deletes:
            return
        ops: list[tuple[str, dict[str, Any] | None]] = [*puts.items(), *((k, None) for k in deletes)]
        ops.sort(key=lambda op: _write_order(op[0]))  # (stable: the order within each part stays)
        chunks = [ops[max(0, end - MAX_TXN_OPS):end] for end in range(len(ops), 0, -MAX_TXN_OPS)[::-1]]
        try:
            # Transactions of hosts' and workers' keys alone go together, up to MAX_TXN_IN_FLIGHT at
            # once (etcd commits requests that come together in one write to its log): half of a
            # 4,096 x 8 job leaving was 330 transactions one after the other, the survivors' places
            # held back behind them. One with a member run or the generation goes once all before it
            # are in, as before.
            for together in _in_flight_together(chunks):
                await self._transact_together(together)
        except BaseException:
            self._rewrite = True  # (cut off part way: the next save compares every key)
            raise
        if resets == self._resets:  # (else the job's lease ran out meanwhile: every key is written again next)
            if len(puts) + len(deletes) < len(values) // 4 and not self._rewrite:
                self._written.update(puts)  # (a few keys: brought up to date, not copied whole)
                for key in deletes:
                    del self._written[key]
            else:
                self._written = dict(values)
            self._rewrite = False
        self.saves += 1

    async def _transact_together(self, chunks: list[list[tuple[str, dict[str, Any] | None]]]) -> None:
        """Write `chunks`, each one transaction, all in flight at once; the first failure cancels
        the others and is raised (the next save compares every key)."""
        tasks = [asyncio.ensure_future(self._transact({self.state_prefix + k: v for k, v in chunk if v is not None},
                                                      [self.state_prefix + k for k, v in chunk if v is None]))
                 for chunk in chunks]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _transact(self, puts: dict[str, dict[str, Any]], deletes: list[str]) -> None:
        while True:
            try:
                ok = await self.store.transact(self.leadership.guard, puts, deletes, lease=self.lease)
                break
            except StoreUnavailable as exc:
                self.trouble(str(exc))
                await asyncio.sleep(RETRY_S)
        self.trouble(None)
        if not ok:
            if await self.leadership.still_leading():
                await self._transact(puts, deletes)  # our key had run out and was taken again
                return
            self.leadership.depose("another rendezvous took the job over (the leader key changed)")
            raise Deposed(self.leadership.lost_reason)

    async def keep_job_lease(self) -> None:
        assert self.lease is not None
        while True:
            await asyncio.sleep(self.job_ttl_s / 3)
            try:
                if not await self.store.refresh_lease(self.lease):
                    _say(Kind.STORE_LEASE_EXPIRED)
                    self.lease = await self.store.grant_lease(self.job_ttl_s)
                    self._written = {key: {} for key in self._written}
                    self._rewrite = True
                    self._resets += 1
            except StoreUnavailable as exc:
                self.trouble(str(exc))

    async def clear(self) -> None:
        """The job is over: its keys go (a new job on this prefix starts afresh)."""
        try:
            if self.lease is not None:
                await self.store.revoke_lease(self.lease)
            entries, _ = await self.store.get_prefix(self.state_prefix)
            for start in range(0, len(entries), MAX_TXN_OPS):
                await self.store.transact(self.leadership.guard, {},
                                          [e.key for e in entries[start:start + MAX_TXN_OPS]])
        except StoreUnavailable as exc:
            _say(Kind.STORE_CLEANUP_FAILED, error=str(exc), ttl_s=self.job_ttl_s)

    @property
    def degraded(self) -> bool:
        """True while the store is unreachable (training goes on; membership changes wait)."""
        return self._trouble is not None

    def trouble(self, message: str | None) -> None:
        """Log the store becoming unreachable, and reachable again, once each."""
        if message is not None and self._trouble is None:
            _say(Kind.STORE_DEGRADED, error=message)
        elif message is None and self._trouble is not None:
            _say(Kind.STORE_RECOVERED)
        self._trouble = message
