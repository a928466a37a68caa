"""The embedded store keeps a bounded history, as etcd compacts its own: a watch that fell behind
the compaction is told so, and leases find their keys without a scan."""

from __future__ import annotations

import asyncio

import pytest

from ringmaster.rendezvous.state import memory_kv
from ringmaster.rendezvous.state.kv import RevisionCompacted
from ringmaster.rendezvous.state.memory_kv import MemoryStore


def test_history_stays_bounded_and_a_watch_behind_it_is_told(monkeypatch) -> None:
    monkeypatch.setattr(memory_kv, "HISTORY_KEPT", 100)

    async def scenario() -> None:
        store = MemoryStore()
        _, start = await store.get_prefix("jobs/")
        for i in range(1000):
            await store.put(f"jobs/k{i % 7}", {"i": i})
        assert len(store._history) < 100
        with pytest.raises(RevisionCompacted):
            async for _ in store.watch_prefix("jobs/", start):
                pass
        _, now = await store.get_prefix("jobs/")
        await store.put("jobs/new", {"i": -1})
        async for change in store.watch_prefix("jobs/", now + 1):  # a watch from a recent revision still works
            assert change.key == "jobs/new"
            break

    asyncio.run(scenario())


def test_a_revoked_lease_removes_its_keys_only() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        first, second = await store.grant_lease(10), await store.grant_lease(10)
        await store.put("a/1", {}, lease=first)
        await store.put("a/2", {}, lease=first)
        await store.put("a/2", {}, lease=second)  # rebound: it no longer goes with the first
        await store.put("a/3", {})
        await store.revoke_lease(first)
        entries, _ = await store.get_prefix("a/")
        assert [e.key for e in entries] == ["a/2", "a/3"]
        await store.revoke_lease(second)
        entries, _ = await store.get_prefix("a/")
        assert [e.key for e in entries] == ["a/3"]

    asyncio.run(scenario())
