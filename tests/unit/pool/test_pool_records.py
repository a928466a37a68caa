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
    pool.pool_hosts.hosts = {"a": 4}
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
        old.book.dirty.update(old.table.jobs)
        await old._save()
        assert not old.book.dirty
        await first.resign()

        second = Leadership(store, PREFIX + "pool/", "second")
        await second.acquire(wait=False)
        new = pool_on(store, second, tmp_path, said)
        await new.take_up()
        jobs = new.table.jobs
        assert set(jobs) == {queued.id, running.id, ended.id}
        assert jobs[queued.id].state == "queued" and jobs[queued.id].max_np == 4
        assert jobs[running.id].state == "suspended" and jobs[running.id].placement == {}  # resumes from its checkpoint
        assert jobs[ended.id].state == "succeeded" and jobs[ended.id].message == "done"
        assert new.submit(["true"], 1, 1, None, "default", 0).id not in {queued.id, running.id, ended.id}
        assert any(kind.value == "pool.taken_up" for kind, _ in said)

        await old._save()  # the deposed pool writes nothing
        old.book.dirty.add(queued.id)
        await old._save()
        assert old.deposed and "another pool leads" in old.deposed

    asyncio.run(scenario())


def test_a_pool_taken_up_before_its_api_serves_judges_a_submission_against_its_hosts(tmp_path) -> None:
    """The API serves once `take_up` is done, before `run` first polls the hosts: a submission
    then is judged against the hosts the source named (not none), and takes no kept job's id."""
    async def scenario() -> None:
        store = MemoryStore()
        kept = JobTable(set()).submit(["true"], 1, 1, 0.0, 4)
        await store.put(job_key(PREFIX, kept.id), to_record(kept))
        pool = PoolService(StaticDiscovery({"a": 2}), "fifo", Settings(), {}, tmp_path, lambda k, **f: None,
                           store=store, prefix=PREFIX)
        await pool.take_up({"a": 2})
        job = pool.submit(["python", "train.py"], 2, 2, None, "default", 0)
        assert job.id != kept.id and set(pool.table.jobs) == {kept.id, job.id}
        await pool.take_up({"a": 2})  # (`run` calls it again: done once)
        assert set(pool.table.jobs) == {kept.id, job.id}

    asyncio.run(scenario())


def test_a_record_that_does_not_parse_is_skipped_and_said(tmp_path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        good = JobTable(set()).submit(["true"], 1, 1, 0.0, 4)
        await store.put(job_key(PREFIX, good.id), to_record(good))
        await store.put(job_key(PREFIX, "evil"), {"id": "evil", "command": "rm -rf /"})
        said: list = []
        pool = pool_on(store, None, tmp_path, said)
        await pool.take_up()
        assert list(pool.table.jobs) == [good.id]
        assert [f["key"] for k, f in said if k.value == "store.unreadable"] == [job_key(PREFIX, "evil")]

    asyncio.run(scenario())


@pytest.mark.parametrize("change, says", [
    ({"state": "exploded"}, "state 'exploded'"),
    ({"min_np": 5}, "min_np 5"),
    ({"priority": "high"}, "priority"),
    ({"command": []}, "command"),
    ({"extra": 1}, "extra"),
    ({"group_size": 2}, "not whole groups of group_size 2"),  # min_np 1
    ({"group_size": 0}, "group_size"),
])
def test_bad_records_are_refused_naming_the_field(change, says) -> None:
    record = to_record(JobTable(set()).submit(["true"], 1, 2, 0.0, 4))
    with pytest.raises(ValueError, match=says):
        from_record({**record, **change})


def test_a_job_submitted_while_the_store_write_is_on_its_way_is_written_with_the_next(tmp_path) -> None:
    """The API answers on the pool's loop while a write awaits the store: what changes meanwhile
    must not be cleared with the write that did not carry it. (The store is the real in-memory
    one; only its write is held open, to reach that moment every time.)"""
    import asyncio

    from ringmaster.discovery import StaticDiscovery
    from ringmaster.rendezvous.pool.service import PoolService
    from ringmaster.rendezvous.scheduling.model import Settings
    from ringmaster.rendezvous.state.memory_kv import MemoryStore

    class HeldStore(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()

        async def transact(self, guards, puts, deletes, *args, **kwargs):  # type: ignore[no-untyped-def]
            await self.release.wait()
            return await super().transact(guards, puts, deletes, *args, **kwargs)

    async def scenario() -> list[str]:
        store = HeldStore()
        pool = PoolService(StaticDiscovery({"h": 2}), "fifo", Settings(), {}, tmp_path, lambda kind, **fields: None,
                           store=store)
        pool.pool_hosts.expected = pool.pool_hosts.hosts = {"h": 2}
        pool.submit(["python", "a.py"], 1, 1, None, "default", 0)
        writing = asyncio.create_task(pool._save())
        await asyncio.sleep(0)  # the write of job-1 is on its way
        pool.submit(["python", "b.py"], 1, 1, None, "default", 0)
        store.release.set()
        await writing
        await pool._save()
        entries, _ = await store.get_prefix("pool/jobs/")
        return sorted(entry.key for entry in entries)

    assert asyncio.run(scenario()) == ["pool/jobs/job-1", "pool/jobs/job-2"]


def test_a_jobs_group_size_is_kept_and_a_record_from_before_groups_reads_as_one() -> None:
    job = JobTable(set()).submit(["true"], 2, 4, 0.0, 4, group_size=2)
    assert from_record(to_record(job)).group_size == 2
    old = {k: v for k, v in to_record(JobTable(set()).submit(["true"], 1, 2, 0.0, 4)).items() if k != "group_size"}
    assert from_record(old).group_size == 1
