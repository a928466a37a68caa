"""The pool's jobs in a store: written as they change, taken up by the next pool that leads, and
a record that does not parse skipped with a word, never half-loaded. (The memory store here;
tests/e2e/test_pool.py takes a pool's jobs over through a real etcd.)"""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from ringmaster.discovery import StaticDiscovery
from ringmaster.rendezvous.pool.records import from_record, job_key, to_record
from ringmaster.rendezvous.pool.service import PoolService
from ringmaster.rendezvous.pool.table import JobTable
from ringmaster.rendezvous.scheduling.model import Settings
from ringmaster.rendezvous.state.leadership import Leadership
from ringmaster.rendezvous.state.memory_kv import MemoryStore

PREFIX = "/ringmaster/test/"


def pool_on(store, leadership, tmp_path: pathlib.Path, said: list) -> PoolService:
    pool = PoolService(StaticDiscovery({"a": 4}), "fifo", Settings(), {}, tmp_path, lambda k, **f: said.append((k, f)),
                       store=store, leadership=leadership, prefix=PREFIX)
    pool.hosts = {"a": 4}
    return pool


def test_a_pool_that_leads_next_takes_up_every_job_as_it_was_left(tmp_path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        first = Leadership(store, PREFIX + "pool/", "first")
        await first.acquire(wait=False)
        said: list = []
        old = pool_on(store, first, tmp_path, said)
        queued = old.submit(["true"], 2, 4, "q", "default", 0)
        running = old.submit(["true"], 1, 2, "r", "default", 0)
        running.state, running.placement, running.started_at = "running", {"a": 2}, 1.0
        ended = old.submit(["true"], 1, 1, "e", "default", 0)
        old.table.end(ended, "succeeded", "done", 2.0)
        old.dirty.update(old.table.jobs)
        await old._save()
        assert not old.dirty
        await first.resign()

        second = Leadership(store, PREFIX + "pool/", "second")
        await second.acquire(wait=False)
        new = pool_on(store, second, tmp_path, said)
        await new._take_up()
        jobs = new.table.jobs
        assert set(jobs) == {queued.id, running.id, ended.id}
        assert jobs[queued.id].state == "queued" and jobs[queued.id].max_np == 4
        assert jobs[running.id].state == "suspended" and jobs[running.id].placement == {}  # resumes from its checkpoint
        assert jobs[ended.id].state == "succeeded" and jobs[ended.id].message == "done"
        assert new.submit(["true"], 1, 1, None, "default", 0).id not in {queued.id, running.id, ended.id}
        assert any(kind.value == "pool.taken_up" for kind, _ in said)

        await old._save()  # the deposed pool writes nothing
        old.dirty.add(queued.id)
        await old._save()
        assert old.deposed and "another pool leads" in old.deposed

    asyncio.run(scenario())


def test_a_record_that_does_not_parse_is_skipped_and_said(tmp_path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        good = JobTable(set()).submit(["true"], 1, 1, 0.0, 4)
        await store.put(job_key(PREFIX, good.id), to_record(good))
        await store.put(job_key(PREFIX, "evil"), {"id": "evil", "command": "rm -rf /"})
        said: list = []
        pool = pool_on(store, None, tmp_path, said)
        await pool._take_up()
        assert list(pool.table.jobs) == [good.id]
        assert [f["key"] for k, f in said if k.value == "store.unreadable"] == [job_key(PREFIX, "evil")]

    asyncio.run(scenario())


@pytest.mark.parametrize("change, says", [
    ({"state": "exploded"}, "state 'exploded'"),
    ({"min_np": 5}, "min_np 5"),
    ({"priority": "high"}, "priority"),
    ({"command": []}, "command"),
    ({"extra": 1}, "extra"),
])
def test_bad_records_are_refused_naming_the_field(change, says) -> None:
    record = to_record(JobTable(set()).submit(["true"], 1, 2, 0.0, 4))
    with pytest.raises(ValueError, match=says):
        from_record({**record, **change})
