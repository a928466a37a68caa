"""The pool's jobs as its store keeps them: read back by the pool that leads next (a pool that
led before stopped, or lost its leadership), written after every scheduling round in which they
changed, and only while this pool leads."""

from __future__ import annotations

from typing import Callable

from ringmaster.common.events import Kind
from ringmaster.rendezvous.pool.records import from_record, job_key, to_record
from ringmaster.rendezvous.pool.table import JobTable
from ringmaster.rendezvous.state.kv import KeyValueStore, StoreUnavailable
from ringmaster.rendezvous.state.leadership import Leadership

#: Why a pool stops writing when its transaction finds another leader's key.
DEPOSED = "the pool's leader key changed: another pool leads"


class JobBook:
    """The records of `table`'s jobs under `prefix` of `store` (none: nothing is kept)."""

    def __init__(self, table: JobTable, store: KeyValueStore | None, leadership: Leadership | None, prefix: str,
                 say: Callable[..., None]) -> None:
        self.table = table
        self.store, self.leadership, self.prefix = store, leadership, prefix
        self.say = say
        self.dirty: set[str] = set()  # jobs whose record the store has not heard yet
        self._taken_up = False

    async def take_up(self) -> None:
        """The jobs the store kept (a pool that led before): running ones resume from their last
        checkpoint; a record that does not parse is said and skipped. Once."""
        if self._taken_up or self.store is None:
            self._taken_up = True
            return
        self._taken_up = True
        entries, _ = await self.store.get_prefix(job_key(self.prefix, ""))
        jobs = []
        for entry in entries:
            try:
                jobs.append(from_record(entry.value))
            except ValueError as exc:
                self.say(Kind.STORE_UNREADABLE, key=entry.key, error=str(exc), count=1)
        self.table.load(jobs)
        if jobs:
            self.say(Kind.POOL_TAKEN_UP, jobs=len(jobs), live=len(self.table.live()))
            self.dirty.update(job.id for job in jobs)

    @property
    def taken_up(self) -> bool:
        return self._taken_up

    async def save(self) -> str | None:
        """Write the records of the jobs that changed, in one transaction that holds only while
        this pool leads. Returns why this pool no longer leads (it must stop), or None."""
        if self.store is None or not (self.dirty or self.table.forgotten):
            return None
        # Taken out before the write: a job submitted or changed while it is on its way (the API
        # answers on this loop meanwhile) is in the next write, not cleared with this one.
        saving, self.dirty = self.dirty, set()
        forgotten, self.table.forgotten = self.table.forgotten, []
        puts = {job_key(self.prefix, i): to_record(self.table.jobs[i]) for i in saving if i in self.table.jobs}
        deletes = [job_key(self.prefix, i) for i in forgotten]
        guards = self.leadership.guard if self.leadership is not None else {}
        try:
            written = await self.store.transact(guards, puts, deletes)
        except StoreUnavailable as exc:
            self.say(Kind.STORE_DEGRADED, error=str(exc))
            written = None
        if not written:  # kept to be written when the store answers again (or never, by a deposed pool)
            self.dirty |= saving
            self.table.forgotten[:0] = forgotten
        return DEPOSED if written is False else None
