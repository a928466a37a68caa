"""One contract, two stores: the in-memory store and etcd (a real etcd on loopback) must behave
alike for everything the rendezvous relies on."""

from __future__ import annotations

import asyncio
import time

import pytest

from ringmaster.rendezvous.state.etcd_kv import EtcdStore
from ringmaster.rendezvous.state.kv import RevisionCompacted, StoreUnavailable


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def run_with(make_store, body) -> None:
    """Run `body(store)` on a fresh store that is closed afterwards, whatever happens."""
    async def main():
        store = await make_store()
        try:
            await body(store)
        finally:
            await store.close()
    run(main())


@pytest.fixture
def prefix(request) -> str:
    return f"/test/{request.node.name}/{time.monotonic_ns()}/"


def test_json_values_under_a_prefix_with_revisions(make_store, prefix) -> None:
    async def body(store):
        r1 = await store.put(prefix + "members/a", {"slots": 2})
        r2 = await store.put(prefix + "members/b", {"slots": 1})
        await store.put(prefix + "x-other/c", {"slots": 9})
        entries, revision = await store.get_prefix(prefix + "members/")
        assert [(e.key,
                 e.value) for e in entries] == [(prefix + "members/a", {"slots": 2}),
                                                (prefix + "members/b", {"slots": 1})]
        assert r2 > r1 and revision >= r2 and entries[0].mod_revision == r1
        await store.delete(prefix + "members/a")
        entries, _ = await store.get_prefix(prefix + "members/")
        assert [e.key for e in entries] == [prefix + "members/b"]
    run_with(make_store, body)


def test_conditional_writes_compare_mod_revision(make_store, prefix) -> None:
    async def body(store):
        key = prefix + "generation"
        assert await store.put_if(key, {"number": 1}, 0)  # create
        assert not await store.put_if(key, {"number": 1}, 0)  # exists already
        [entry], _ = await store.get_prefix(key)
        assert await store.put_if(key, {"number": 2}, entry.mod_revision)
        assert not await store.put_if(key, {"number": 3}, entry.mod_revision)  # stale
        [entry], _ = await store.get_prefix(key)
        assert entry.value == {"number": 2}
    run_with(make_store, body)


def test_a_transaction_applies_all_or_nothing_under_its_guards(make_store, prefix) -> None:
    async def body(store):
        await store.put(prefix + "leader", {"who": "a"})
        await store.put(prefix + "workers/old", {"phase": "exited"})
        [leader], _ = await store.get_prefix(prefix + "leader")
        lease = await store.grant_lease(30)
        puts = {prefix + "workers/1": {"phase": "member"}, prefix + "generation": {"number": 1}}
        guards = {prefix + "leader": leader.mod_revision, prefix + "generation": 0}
        assert await store.transact(guards, puts, [prefix + "workers/old"], lease=lease)
        entries, _ = await store.get_prefix(prefix)
        assert {e.key: e.value for e in entries} == {prefix + "leader": {"who": "a"}, **puts}
        # A deposed leader (the leader key changed) writes nothing, not even the unguarded keys.
        await store.put(prefix + "leader", {"who": "b"})
        assert not await store.transact({prefix + "leader": leader.mod_revision}, {prefix + "workers/2": {"x": 1}},
                                        [prefix + "workers/1"])
        entries, _ = await store.get_prefix(prefix + "workers/")
        assert [e.key for e in entries] == [prefix + "workers/1"]
        await store.revoke_lease(lease)  # the job lease takes its keys along
        assert [e.key for e in (await store.get_prefix(prefix))[0]] == [prefix + "leader"]
    run_with(make_store, body)


def test_a_lease_that_is_not_refreshed_takes_its_keys_along(make_store, prefix) -> None:
    async def body(store):
        kept, lost = await store.grant_lease(2), await store.grant_lease(1)
        await store.put(prefix + "agents/kept", {"pid": 1}, lease=kept)
        await store.put(prefix + "agents/lost", {"pid": 2}, lease=lost)
        deadline = time.monotonic() + 10
        while True:
            assert await store.refresh_lease(kept)
            entries, _ = await store.get_prefix(prefix + "agents/")
            if [e.key for e in entries] == [prefix + "agents/kept"]:
                break
            assert time.monotonic() < deadline, "the unrefreshed lease did not expire"
            await asyncio.sleep(0.2)
        assert not await store.refresh_lease(lost)
        await store.revoke_lease(lost)  # an expired lease: revoking it is no error
        await store.revoke_lease(kept)
        assert (await store.get_prefix(prefix + "agents/"))[0] == []
    run_with(make_store, body)


def test_a_watch_resumes_from_a_revision(make_store, prefix) -> None:
    async def body(store):
        start = await store.put(prefix + "w/1", {"n": 1})
        await store.put(prefix + "w/2", {"n": 2})
        await store.delete(prefix + "w/1")
        seen = []
        async for change in store.watch_prefix(prefix + "w/", start):
            seen.append((change.key.rsplit("/", 1)[1], change.value))
            if len(seen) == 3:
                break
        assert seen == [("1", {"n": 1}), ("2", {"n": 2}), ("1", None)]
    run_with(make_store, body)


def test_a_watch_below_the_compacted_revision_says_so(make_store, prefix) -> None:
    async def body(store):
        first = await store.put(prefix + "c", {"n": 1})
        last = await store.put(prefix + "c", {"n": 2})
        await store.compact(last)
        with pytest.raises(RevisionCompacted):
            async for _ in store.watch_prefix(prefix, first):
                break
    run_with(make_store, body)


def test_a_value_that_is_not_json_is_skipped_not_misread(etcd, prefix) -> None:
    """Anyone with access to etcd may write under the prefix: such a value is never unpickled or
    guessed at; it is counted and left out, and the rest is read."""
    async def body(store):
        await store._client.put((prefix + "foreign").encode(), b"\x80\x04pickle")
        await store.put(prefix + "ours", {"a": 1})
        entries, _ = await store.get_prefix(prefix)
        assert [(e.key, e.value) for e in entries] == [(prefix + "ours", {"a": 1})]
        assert store.unreadable == 1

    async def connect():
        return await EtcdStore.connect([etcd.endpoint])
    run_with(connect, body)


def test_unreachable_etcd_names_the_endpoints_tried() -> None:
    from harness import free_port

    ports = [free_port(), free_port()]
    with pytest.raises(StoreUnavailable) as caught:
        run(EtcdStore.connect([("127.0.0.1", p) for p in ports], timeout_s=1))
    for port in ports:
        assert f"127.0.0.1:{port}" in str(caught.value)
