"""The rendezvous' state in a store: its keys, taking a job over, leadership, agent leases.

Store-backed tests run against both stores (in memory, and a real etcd on loopback).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from coordinator_rig import Rig, record

from ringmaster.common.events import Kind
from ringmaster.common.reconnect import Backoff, parse_addresses
from ringmaster.rendezvous.control.effects import Assign
from ringmaster.rendezvous.control.records import Phase
from ringmaster.rendezvous.state import job_record
from ringmaster.rendezvous.state.agent_leases import AgentLeases
from ringmaster.rendezvous.state.journal import MAX_TXN_IN_FLIGHT, Deposed, Journal
from ringmaster.rendezvous.state.leadership import AnotherLeader, Leadership
from ringmaster.rendezvous.state.url import DEFAULT_PREFIX, StoreUrlError, parse_store


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture
def prefix(request) -> str:
    return f"/test/{request.node.name}/{time.monotonic_ns()}/"


def with_store(make_store, body) -> None:
    async def main():
        store = await make_store()
        try:
            await body(store)
        finally:
            await store.close()
    run(main())


# ---------------------------------------------------------------- --store
@pytest.mark.parametrize("value, kind, endpoints, prefix", [
    ("memory", "memory", (), DEFAULT_PREFIX),
    ("etcd://127.0.0.1:2379", "etcd", (("127.0.0.1", 2379),), DEFAULT_PREFIX),
    ("etcd://a:1,b:2/jobs/train-7", "etcd", (("a", 1), ("b", 2)), "/jobs/train-7/"),
    ("etcd://a:1/x/", "etcd", (("a", 1),), "/x/"),
    ("etcd://user@a:1,b:2/x", "etcd", (("a", 1), ("b", 2)), "/x/"),  # a user, not a host name
    ("etcds://a:1", "etcd", (("a", 1),), DEFAULT_PREFIX),
])
def test_store_urls(value, kind, endpoints, prefix) -> None:
    spec = parse_store(value, password="pw" if "@" in value else None)
    assert (spec.kind, spec.endpoints, spec.prefix) == (kind, endpoints, prefix)


@pytest.mark.parametrize("value, message", [
    ("redis://a:1", "expected 'memory' or 'etcd\\[s\\]://"),
    ("etcd://a", "endpoint 'a' is not HOST:PORT"),
    ("etcd://a:99999", "is not HOST:PORT"),
    ("etcd://a:1,,b:2", "endpoint '' is not HOST:PORT"),
    ("etcd://a:1/x//y", "has an empty part"),
    ("etcd://user@a:1", "etcd user 'user' needs a password: give --store-password-file"),
    ("etcd://@a:1", "write the user before '@'"),
    ("etcd://u:hidden@a:1", r"etcd://u:\*\*\*@a:1'?: a password in the URL can be read by every user"),
])
def test_bad_store_urls_say_what_is_expected(value, message) -> None:
    """A password in the URL would be in /proc/PID/cmdline for every local user: refused, unrepeated."""
    with pytest.raises(StoreUrlError, match=message) as info:
        parse_store(value)
    assert "hidden" not in str(info.value)
    with pytest.raises(StoreUrlError, match="no user"):
        parse_store("etcd://a:1", password="pw")


# ---------------------------------------------------------------- the job as keys
def running_job() -> tuple[Rig, list[str]]:
    rig = Rig(min_np=2, max_np=8)
    ids = rig.start_elastic({"a": 2, "b": 1})
    rig.worker_disconnected(ids[1])  # generation 1 over; the others wait for the next
    rig.worker_exited("a", ids[1], 0, 9, False)  # killed: host a is spared (b alone is below --min-np)
    rig.worker_ready(ids[0], 1, "allreduce failed", True)
    rig.worker_ready(ids[2], 1, "allreduce failed", True)
    return rig, ids


def test_per_member_keys_in_json_and_a_record_that_round_trips() -> None:
    rig, ids = running_job()
    values = record(rig)
    live = {f"workers/{w.worker_id}" for w in rig.coordinator.live_workers()}
    assert {f"workers/{ids[0]}", f"workers/{ids[2]}"} <= live
    # One key per host and per live worker; the dead worker of the last generation is history.
    # The members are two runs: the survivors kept their order keys (0 and 2) from generation 1.
    runs = {"members/0": {"host": "a", "workers": [1]}, "members/2": {"host": "b", "workers": [3]}}
    assert [ids[0], ids[2]] == ["a/1", "b/3"]
    assert set(values) == {"job", "generation", "hosts/a", "hosts/b", *live,
                           *runs} and f"workers/{ids[1]}" not in values
    assert {key: values[key] for key in runs} == runs
    assert values["generation"]["number"] == 2 and values["generation"]["size"] == 2
    assert values["job"]["version"] == job_record.VERSION
    restored = job_record.read_job(values)
    assert restored is not None and restored.generation is not None
    assert restored.generation.members == rig.gen().members  # ranks, local and cross ranks computed again
    assert restored.generation.order == rig.gen().order == (0, 2)
    assert restored.workers[ids[0]].phase is Phase.MEMBER and restored.workers[ids[0]].generation == 2
    again = Rig(min_np=2, max_np=8)
    again.resume(restored)
    assert record(again) == values  # nothing lost or invented by the round trip
    assert again.coordinator.workers[ids[0]].env == rig.coordinator.workers[ids[0]].env  # the rest: the job's own


def test_a_new_generation_rewrites_only_the_generation_and_the_workers_that_changed() -> None:
    rig = Rig(min_np=2, max_np=16)
    ids = rig.start_elastic({"a": 4, "b": 4, "c": 4})
    before = record(rig)
    rig.agent_disconnected("c")  # a host lost: the survivors are placed in the next generation at once
    assert rig.gen().number == 2
    after = record(rig)
    puts, deletes = job_record.diff(before, after)
    lost = {f"workers/{i}" for i in ids if i.startswith("c/")}
    assert set(puts) <= {"job", "generation", "hosts/c"} | lost, sorted(puts)
    assert not any(key.startswith("workers/a/") or key.startswith("workers/b/") for key in [*puts, *deletes])
    # The members: host c's run goes, a's and b's stay as they were (not a list of every member).
    assert [key for key in deletes if key.startswith("members/")] == ["members/8"]
    numbers = [int(i.rpartition("/")[2]) for i in ids[:4]]
    assert after["members/0"] == {"host": "a", "workers": numbers} and after["members/4"] == before["members/4"]
    # Host d is added: its workers' run goes last, under keys above those of generation 2.
    rig.set_hosts({"a": 4, "b": 4, "d": 4})
    rig.agent_connected("d", 300)
    for worker_id in rig.specs("d"):
        rig.worker_connected(worker_id, 1)
        rig.worker_ready(worker_id, 0, "", True)
    rig.commit_at_update(ids[:8], 2)
    assert rig.gen().number == 3 and rig.gen().order == tuple(range(12))
    puts, deletes = job_record.diff(after, record(rig))
    assert [key for key in [*puts, *deletes] if key.startswith("members/")] == ["members/8"]
    assert puts["members/8"]["host"] == "d"


def test_members_leaving_at_a_scale_down_are_said_by_their_hosts_and_a_successor_takes_the_job_over() -> None:
    """Half the hosts leave discovery: the generation that forms without them writes their hosts'
    keys, not their workers' (each leaver's record stays as it was while a member: at 4,096 x 8
    those were 16,384 keys before the survivors' places could go out). A rendezvous that takes the
    job over there (its leavers not yet gone) reads them as the last generation's, stopping."""
    rig = Rig(min_np=2, max_np=16)
    ids = rig.start_elastic({"a": 2, "b": 2, "c": 2, "d": 2})
    rig.set_hosts({"a": 2, "b": 2})
    rig.commit_at_update(ids, 1)
    assert rig.gen().number == 2 and len(rig.gen().members) == 4
    before = record(rig)
    leavers = [i for i in ids if i[0] in "cd"]
    assert all(rig.coordinator.workers[i].stopping and rig.coordinator.workers[i].live for i in leavers)
    # (the record before this generation formed: the update was written, the leavers still members)
    formed = job_record.job_values(rig.coordinator.saved())
    assert formed["hosts/c"]["left"] == formed["hosts/d"]["left"] == 1
    assert all(formed[f"workers/{i}"] == before[f"workers/{i}"] for i in ids)
    assert all("generation" not in formed[f"workers/{i}"] for i in leavers)
    restored = job_record.read_job(formed)
    assert restored is not None and restored.generation is not None and restored.generation.number == 2
    for i in leavers:
        w = restored.workers[i]
        assert (w.phase, w.generation, w.stopping) == (Phase.MEMBER, 1, True), i
    assert all(not restored.workers[i].stopping and restored.workers[i].generation == 2 for i in ids[:4])
    # A host's mark at or past the current generation is not one a rendezvous writes: refused.
    for bad in (2, 7):
        with pytest.raises(job_record.IncompatibleState, match="members of no generation"):
            job_record.read_job({**formed, "hosts/c": {**formed["hosts/c"], "left": bad}})
    # The successor carries on: the survivors keep generation 2, the leavers are not placed.
    new = Rig(min_np=2, max_np=16)
    new.now = 50.0
    new.resume(restored)
    for pid, host in enumerate("abcd", start=100):
        new.agent_connected(host, pid, running=[i for i in ids if i[0] == host])
    assert new.gen().number == 2 and {a.worker_id for a in new.gen().members} == set(ids[:4])
    assert all(new.coordinator.workers[i].stopping for i in leavers)


def test_a_host_whose_leavers_mark_moves_on_has_its_earlier_leavers_written_in_full() -> None:
    """A host speaks for the leavers of one generation: when more of its members leave at a later
    one while earlier leavers still run, those are written with their own generation again (the
    record brought up to date, as the journal keeps it, is read back right)."""
    rig = Rig(min_np=1, max_np=16)
    ids = rig.start_elastic({"a": 4, "b": 2})
    rig.scale(3)  # a's last worker and b's leave at generation 2's forming
    rig.commit_at_update(ids, 1)
    assert rig.gen().number == 2
    first = [i for i in ids if i not in {a.worker_id for a in rig.gen().members}]
    assert first and all(rig.coordinator.workers[i].live for i in first)
    rig.scale(1)
    rig.commit_at_update([a.worker_id for a in rig.gen().members], 2)
    assert rig.gen().number == 3
    values = record(rig)
    assert values["hosts/a"]["left"] == 2 and values["workers/a/4"]["generation"] == 1
    restored = job_record.read_job(values)
    assert restored is not None
    for i in first:
        assert (restored.workers[i].generation, restored.workers[i].stopping) == (1, True), i
    fresh = job_record.job_values(rig.coordinator.saved())
    assert fresh == values  # the record brought up to date is the one built afresh


def test_a_record_of_version_3_is_read() -> None:
    """Version 3 is version 4 without hosts' `left` (each leaver's record says it all itself)."""
    rig, _ = running_job()
    values = record(rig)
    old = {**values, "job": {**values["job"], "version": 3}}
    assert old["job"]["version"] in job_record.READABLE
    restored = job_record.read_job(old)
    assert restored is not None and restored.generation is not None and restored.generation.number == 2


def test_a_resumed_job_carries_on_without_restarting_workers() -> None:
    rig, ids = running_job()
    restored = job_record.read_job(record(rig))
    new = Rig(min_np=2, max_np=8)
    new.now = 100.0  # another process, another clock
    new.resume(restored)
    assert "resumed the job from the store: generation 2" in new.coordinator.summary.events[-1].message
    # The agents reconnect naming the workers they still run: nothing is started or stopped.
    new.agent_connected("a", 100, running=list(rig.specs("a")))
    new.agent_connected("b", 101, running=list(rig.specs("b")))
    assert set(new.specs("a")) == set(rig.specs("a")) and set(new.specs("b")) == set(rig.specs("b"))
    # A worker reconnects still training in generation 2: it gets its assignment again.
    new.worker_connected(ids[2], 1, elastic=True)
    assert new.last(ids[2], Assign).generation == 2
    # Heartbeat windows start at the resume, on the new clock: nobody is timed out at once.
    new.now += 1
    new.tick()
    assert all(w.live for w in (new.coordinator.workers[ids[0]], new.coordinator.workers[ids[2]]))
    # An agent whose hello reaches the new rendezvous before the job is resumed from the store
    # is told nothing until then: its workers keep running.
    early = Rig(min_np=2, max_np=8)
    early.agent_connected("a", 100, running=list(rig.specs("a")))
    assert "a" not in early.agents
    early.resume(job_record.read_job(record(rig)))
    assert set(early.specs("a")) == set(rig.specs("a"))
    # Workers that die while the rendezvous was away are known when their agent reconnects.
    later = Rig(min_np=1, max_np=8)
    later.resume(job_record.read_job(record(new)))
    later.agent_connected("b", 101, running=[])
    assert not later.coordinator.workers[ids[2]].live
    # Generation 2 is over, and the survivor (in hvd.elastic.run) is placed in the next one at
    # once, without waiting for its Ready.
    assert later.coordinator.generation.number == 3
    assert [a.worker_id for a in later.coordinator.generation.members] == [ids[0]]


def test_a_worker_that_waited_while_the_rendezvous_was_away_is_placed_by_its_hello() -> None:
    rig, ids = running_job()
    gen2 = rig.coordinator.generation
    rig.worker_disconnected(ids[2])  # generation 2 ends too; ids[0] waits, its Ready was lost
    new = Rig(min_np=1, max_np=8)
    new.resume(job_record.read_job(record(rig)))
    new.agent_connected("a", 100, running=[ids[0]])
    new.agent_connected("b", 101, running=[])
    new.worker_connected(ids[0], 1, waiting_after=gen2.number, failure="allreduce failed", elastic=True)
    assert new.coordinator.generation.number == 3
    assert new.last(ids[0], Assign).generation == 3


def test_ringmaster_run_restarts_every_worker_when_its_hosts_died_with_it() -> None:
    rig, ids = running_job()
    new = Rig(min_np=2, max_np=8)
    new.resume(job_record.read_job(record(rig)), agents_survive=False)
    assert not any(w.live for w in new.coordinator.workers.values())
    assert new.coordinator.generation.over is not None
    assert not any(h.agent_connected for h in new.coordinator.pool.hosts.values())


@pytest.mark.parametrize("values, message", [
    ({"job": {"format": "ringmaster-rendezvous", "version": 99}}, "version 99; this ringmaster reads"),
    ({"job": {"format": "other"}}, "format 'other'"),
    ({"config": {"a": 1}}, "not written by ringmaster"),
    ({"job": {**record(running_job()[0])["job"], "next_id": "x"}}, "damaged or from another version"),
])
def test_a_store_written_by_something_else_is_refused_not_misread(values, message) -> None:
    with pytest.raises(job_record.IncompatibleState, match=message):
        job_record.read_job(values)


def member_runs_changed(change) -> dict:
    """The record of `running_job` (members: run 0 on host a, run 2 on host b) with its member
    runs changed by `change`."""
    values = record(running_job()[0])
    runs = {key: value for key, value in values.items() if key.startswith("members/")}
    return {**{k: v for k, v in values.items() if k not in runs}, **change(runs)}


@pytest.mark.parametrize("change, message", [
    (lambda runs: {"members/0": runs["members/0"]}, "has 2 members but its runs in the store list 1"),
    (lambda runs: {**runs, "members/0": {"host": "a", "workers": [1, 5, 6]}}, "at order keys 0 and 2 overlap"),
    (lambda runs: {"members/0": runs["members/0"], "members/x2": runs["members/2"]}, "'members/x2'"),
    (lambda runs: {**runs, "members/2": {"host": "b\nroot", "workers": [3]}}, "damaged"),
    (lambda runs: {**runs, "members/2": {"host": "b", "workers": [-3]}}, "negative worker number"),
    (lambda runs: {**runs, "members/2": {"host": "b", "workers": []}}, "damaged"),
    (lambda runs: {**runs, "members/2": {"host": "b", "workers": [4]}}, "lacks the records of members b/4"),
])
def test_member_runs_written_in_part_or_by_something_else_are_refused(change, message) -> None:
    """A leader that died between two transactions of a large change, or someone else's writes,
    leave runs that do not add up to the generation: the job is refused, naming what is wrong."""
    with pytest.raises(job_record.IncompatibleState, match=message):
        job_record.read_job(member_runs_changed(change))


def test_names_read_back_from_the_store_are_checked_like_names_from_the_wire() -> None:
    """A key `hosts/-oProxyCommand=...` would reach ssh's command line as a host; a worker whose
    record names another host, or a newline in a name, would reach logs and commands. Such keys
    are skipped and named; the job itself is read."""
    values = record(running_job()[0])
    host_value = values["hosts/a"]
    worker_key = next(k for k in values if k.startswith("workers/a/"))
    hostile = {
        **values,
        "hosts/-oProxyCommand=id >x": host_value,
        "hosts/c\n": host_value,
        "workers/b/99": {**values[worker_key], "host": "a"},  # a worker id of host b, said to run on a
        "workers/a/x1": values[worker_key],
    }
    restored = job_record.read_job(hostile)
    assert restored is not None
    assert set(restored.hosts) == {"a", "b"}
    assert "b/99" not in restored.workers and "a/x1" not in restored.workers
    assert sorted(key for key, _ in restored.skipped) == sorted(
        ["hosts/-oProxyCommand=id >x", "hosts/c\n", "workers/b/99", "workers/a/x1"])
    assert job_record.read_job(values).skipped == []


def test_garbage_under_agents_never_stops_the_lease_watch(etcd, prefix, logged_events) -> None:
    """Anyone with access to etcd may write under the prefix: a value that is not JSON is said,
    counted and skipped, and an agent whose lease then expires is still reported."""
    import aetcd

    from ringmaster.rendezvous.state.etcd_kv import EtcdStore

    async def main():
        store = await EtcdStore.connect([etcd.endpoint], log=logged_events.events.append)
        raw = aetcd.Client(host=etcd.endpoint[0], port=etcd.endpoint[1])
        try:
            expired: list[str] = []
            leases = AgentLeases(store, prefix, 2, expired.append)
            await leases.connected("silent", 2)
            watch = asyncio.create_task(leases.watch())
            await raw.put(f"{prefix}agents/junk".encode(), b"not json")
            await raw.put(f"{prefix}agents/".encode() + b"\xff\xfe", b"{}")  # a key that is not UTF-8
            deadline = time.monotonic() + 15
            while not expired:  # "silent" never heartbeats: its lease runs out on etcd's clock
                assert not watch.done(), f"the watch stopped: {watch.exception()!r}"
                assert time.monotonic() < deadline, "the lease that ran out after the garbage was not reported"
                await asyncio.sleep(0.1)
            assert expired == ["silent"]
            assert store.unreadable >= 1
            assert any("agents/junk" in e.fields["key"] for e in logged_events.of(Kind.STORE_UNREADABLE))
            entries, _ = await store.get_prefix(prefix + "agents/")  # reading skips it too
            assert [e.key for e in entries] == []
            watch.cancel()
        finally:
            await raw.close()
            await store.close()
    run(main())


def test_diff_writes_what_changed_and_deletes_what_went() -> None:
    puts, deletes = job_record.diff({"a": {"x": 1}, "b": {"x": 2}}, {"a": {"x": 1}, "c": {"x": 3}})
    assert puts == {"c": {"x": 3}} and deletes == ["b"]


def test_a_record_rebuilds_only_what_changed_and_matches_a_fresh_build() -> None:
    rig, ids = running_job()
    first = record(rig)
    rig.worker_heartbeat(ids[0], 7, True)  # a timer and a counter change: not part of the record
    rig.worker_done(ids[2], 9)  # a recorded field changes
    second = record(rig)
    c = rig.coordinator
    fresh = job_record.job_values(c.saved())  # built anew, without the rig's snapshots
    assert second == fresh  # reusing snapshots never hides a change
    assert first[f"workers/{ids[2]}"]["done"] is False and second[f"workers/{ids[2]}"]["done"] is True
    assert second["hosts/a"] is first["hosts/a"] and second[f"workers/{ids[0]}"] == first[f"workers/{ids[0]}"]
    puts, deletes = job_record.diff(first, second)
    # ... and the replacement still starting on host a is stopped: the job is finishing
    starting = {f"workers/{w.worker_id}" for w in c.workers.values() if w.worker_id not in ids and w.stopping}
    assert len(starting) == 1
    assert set(puts) == {f"workers/{ids[2]}", "job", *starting} and deletes == []


def test_within_a_generation_a_build_looks_only_at_the_workers_that_changed() -> None:
    rig, ids = running_job()
    c = rig.coordinator
    snap = job_record.Snapshots()
    job_record.build_values(c.saved(), snap)
    assert snap.changed is None  # the first build looks at every key
    newcomer = next(w.worker_id for w in c.workers.values() if w.worker_id not in ids and w.live)
    rig.worker_connected(newcomer, 42)
    values = job_record.build_values(c.saved(), snap)
    assert snap.changed == {f"workers/{newcomer}"} and values == job_record.job_values(c.saved())
    rig.worker_ready(newcomer, 0, "", True)
    rig.worker_ready(ids[0], 2, "", True)  # a new generation: every member's key is looked at again
    assert c.generation is not None and c.generation.number == 3
    assert job_record.build_values(c.saved(), snap) == job_record.job_values(c.saved()) and snap.changed is None


# ---------------------------------------------------------------- journal and leadership
async def leading_journal(store, prefix: str) -> tuple[Leadership, Journal]:
    """A rendezvous leading a new job on `prefix`, and its journal (the store holds no job yet)."""
    leader = Leadership(store, prefix, "a:1", ttl_s=5)
    await leader.acquire(wait=False)
    journal = Journal(store, prefix, leader, job_ttl_s=30)
    assert await journal.load() is None
    return leader, journal


def test_the_journal_writes_changed_keys_only_and_a_deposed_leader_writes_nothing(make_store, prefix) -> None:
    async def body(store):
        leader, journal = await leading_journal(store, prefix)
        rig, ids = running_job()
        await journal.save(record(rig))
        entries, revision = await store.get_prefix(prefix + "state/")
        assert {e.key.removeprefix(prefix + "state/") for e in entries} == set(record(rig))
        rig.worker_heartbeat(ids[0], 7, True)  # a heartbeat is no state change
        rig.worker_disconnected(ids[2])  # one worker fails: its key and the generation's change
        await journal.save(record(rig))
        after, _ = await store.get_prefix(prefix + "state/")
        changed = sorted(e.key.removeprefix(prefix + "state/") for e in after if e.mod_revision > revision)
        # The failed worker's key and the generation change (and a replacement is started);
        # the keys of the hosts and of the worker that is still training are not rewritten.
        assert {"generation", f"workers/{ids[2]}"} <= set(changed)
        assert not {"hosts/a", "hosts/b", f"workers/{ids[0]}"} & set(changed)
        # Another process took the leader key: this one may not write any more.
        await leader.resign()
        usurper = Leadership(store, prefix, "b:2", ttl_s=5)
        await usurper.acquire(wait=False)
        rig.agent_disconnected("b")  # a change the record keeps (a member's Ready is not one: its hello says it)
        with pytest.raises(Deposed):
            await journal.save(record(rig))
        assert leader.lost.is_set()
        assert await store.get_prefix(prefix + "state/") == (after, (await store.get_prefix(prefix + "state/"))[1])
        # The new leader reads the job exactly as the old one left it, and clears it at the end.
        journal2 = Journal(store, prefix, usurper, job_ttl_s=30)
        restored = await journal2.load()
        assert restored is not None and restored.generation.over is not None
        await journal2.clear()
        assert (await store.get_prefix(prefix + "state/"))[0] == []
        await usurper.resign()
    with_store(make_store, body)


def test_saves_brought_up_to_date_from_what_changed_leave_the_store_as_a_fresh_record(make_store, prefix) -> None:
    """The journal's own builds bring the workers' keys up to date from the workers that changed
    (`JobWorkers.take_changed`) and write only the keys a build changed: after each of a run of
    changes, within a generation and across new ones, the store holds what a record built anew
    from every worker holds."""
    async def body(store):
        leader, journal = await leading_journal(store, prefix)
        rig, ids = running_job()
        c = rig.coordinator

        async def saved_and_compared() -> set[str]:
            """Saves; the keys written."""
            _, before = await store.get_prefix(prefix + "state/")
            await journal.save_job(c.saved())
            entries, _ = await store.get_prefix(prefix + "state/")
            assert {e.key.removeprefix(prefix + "state/"): e.value for e in entries} == job_record.job_values(c.saved())
            return {e.key.removeprefix(prefix + "state/") for e in entries if e.mod_revision > before}

        assert len(await saved_and_compared()) > 3
        newcomer = next(w.worker_id for w in c.workers.values() if w.worker_id not in ids and w.live)
        rig.worker_heartbeat(ids[0], 7, True)  # no worker's key changes (the job's steps do)
        assert await saved_and_compared() <= {"job"}
        assert await saved_and_compared() == set()  # nothing changed: nothing written
        rig.worker_connected(newcomer, 42)  # within the generation: the newcomer's key alone
        assert await saved_and_compared() == {f"workers/{newcomer}"}
        rig.worker_ready(newcomer, 0, "", True)
        rig.worker_ready(ids[0], 2, "", True)  # (ends the host update: a new generation)
        await saved_and_compared()
        rig.drain_host("b", 30.0)
        await saved_and_compared()
        rig.agent_disconnected("b")  # a host's agent gone: its workers exit, a generation ends
        await saved_and_compared()
        rig.worker_done(ids[0], 9)
        await saved_and_compared()
        await leader.resign()
    with_store(make_store, body)


def test_one_leader_a_standby_takes_over_when_its_lease_expires(make_store, prefix, logged_events) -> None:
    async def body(store):
        first = Leadership(store, prefix, "a:1", ttl_s=2)
        await first.acquire(wait=False)
        with pytest.raises(AnotherLeader, match="led by the rendezvous at a:1"):
            await Leadership(store, prefix, "b:2", ttl_s=2).acquire(wait=False)
        standby = Leadership(store, prefix, "b:2", ttl_s=2)
        waiting = asyncio.create_task(standby.acquire(wait=True))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        assert [e.fields for e in logged_events.of(Kind.LEADER_STANDING_BY)] == [{"leader": "a:1"}]
        started = time.monotonic()  # the leader dies: nobody refreshes its lease
        await asyncio.wait_for(waiting, 10)
        assert time.monotonic() - started < 6
        assert standby.revision > first.revision
        await standby.resign()
    with_store(make_store, body)


def test_an_agent_whose_lease_expires_is_reported_and_its_key_removed(make_store, prefix) -> None:
    async def body(store):
        expired: list[str] = []
        leases = AgentLeases(store, prefix, 2, expired.append)
        watch = asyncio.create_task(leases.watch())
        await leases.connected("alive", 1)
        await leases.connected("silent", 2)
        await leases.connected("leaving", 3)
        await leases.disconnected("leaving")  # a clean goodbye is no expiry
        deadline = time.monotonic() + 10
        while not expired:
            assert time.monotonic() < deadline, "the silent agent's lease did not expire"
            leases._refreshed["alive"] = 0.0  # refresh at every heartbeat here
            await leases.heartbeat("alive")
            await asyncio.sleep(0.2)
        assert expired == ["silent"]
        entries, _ = await store.get_prefix(prefix + "agents/")
        assert [e.key.removeprefix(prefix + "agents/") for e in entries] == ["alive"]
        # A new leader adopts the lease that is left.
        assert await AgentLeases(store, prefix, 2, expired.append).adopt() == {"alive"}
        watch.cancel()
    with_store(make_store, body)


def test_a_new_leader_ignores_inherited_leases_running_out_and_replaces_them_on_reconnection(
        make_store, prefix) -> None:
    """While no rendezvous runs nobody refreshes leases, so their expiry is no sign of death."""
    async def body(store):
        old = AgentLeases(store, prefix, 2, lambda host: None)
        await old.connected("back", 1)
        await old.connected("gone", 2)
        expired: list[str] = []
        new = AgentLeases(store, prefix, 2, expired.append)
        assert await new.adopt() == {"back", "gone"}
        watch = asyncio.create_task(new.watch())
        await asyncio.sleep(0.3)  # the watch is running before the agent reconnects
        await new.connected("back", 1)  # replaces (revokes) the inherited lease
        assert new.leases["back"] != old.leases["back"]
        deadline = time.monotonic() + 10
        while True:  # the lease nobody replaced runs out in the store
            entries, _ = await store.get_prefix(prefix + "agents/")
            if [e.key.removeprefix(prefix + "agents/") for e in entries] == ["back"]:
                break
            assert time.monotonic() < deadline, "the inherited lease of 'gone' did not run out"
            new._refreshed["back"] = 0.0
            await new.heartbeat("back")
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)  # a report would arrive right after the deletion
        assert expired == [], "an inherited lease's expiry was reported as a lost agent"
        watch.cancel()
    with_store(make_store, body)


# ---------------------------------------------------------------- reconnecting clients
def test_backoff_goes_round_the_addresses_then_waits_longer_up_to_a_deadline() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    backoff = Backoff(5.0, clock=lambda: now[0], sleep=sleep)
    tried = []
    while (address := backoff.next_address(["a:1", "b:2"])) is not None:
        tried.append(address)
        now[0] += 0.5  # each attempt takes a while
    assert tried[:4] == ["a:1", "b:2", "a:1", "b:2"]
    assert slept[:3] == [0.1, 0.2, 0.4] and now[0] >= 5.0
    backoff.reset()
    assert backoff.next_address(["a:1", "b:2"]) is not None
    assert parse_addresses(" a:1, ,b:2 ") == ["a:1", "b:2"]


async def _leading_journal(store, prefix: str, hosts: int) -> tuple[Journal, Rig]:
    """A journal of the job's leader, and an elastic job of `hosts` hosts of one slot to save."""
    leader = Leadership(store, prefix, "a:1", ttl_s=5)
    await leader.acquire(wait=False)
    journal = Journal(store, prefix, leader, job_ttl_s=30)
    await journal.load()
    rig = Rig(min_np=2)
    rig.start_elastic({f"h{i}": 1 for i in range(hosts)})
    return journal, rig


def test_a_large_job_is_saved_in_transactions_etcd_accepts(make_store, prefix) -> None:
    """etcd refuses transactions of more than 128 writes: 300 hosts and workers still save."""
    async def body(store):
        journal, rig = await _leading_journal(store, prefix, hosts=300)
        values = record(rig)
        assert len(values) > 900
        await journal.save(values)
        entries, _ = await store.get_prefix(prefix + "state/")
        assert {e.key.removeprefix(prefix + "state/"): e.value for e in entries} == values
        # A host lost is one transaction: its keys and run go, the generation and counters change.
        transactions: list[tuple[dict, list]] = []
        transact = store.transact

        async def recorded(guards, puts, deletes, lease=None):
            transactions.append((puts, deletes))
            return await transact(guards, puts, deletes, lease=lease)
        store.transact = recorded
        rig.agent_disconnected("h7")
        await journal.save(record(rig))
        assert len(transactions) == 1
        assert {key.removeprefix(prefix + "state/") for key in transactions[0][0]} == {"job", "generation", "hosts/h7"}
        assert {key.removeprefix(prefix + "state/") for key in transactions[0][1]} == {"workers/h7/8", "members/7"}
        # A change of more than one transaction writes the generation last, after the hosts' and
        # workers' keys, with as many of its runs as fit.
        transactions.clear()
        rig.set_hosts({f"h{i}": 1 for i in range(300) if i % 2})
        rig.commit_at_update(list(rig.gen().member_ids), 2)
        assert rig.gen().number == 3 and len(rig.gen().members) == 149
        await journal.save(record(rig))
        assert len(transactions) > 1 and prefix + "state/generation" in transactions[-1][0]
        kinds = [[key.removeprefix(prefix + "state/").split("/")[0] for key in [*puts, *deletes]]
                 for puts, deletes in transactions]
        assert set(kinds[-1]) == {"members", "generation", "job"} and kinds[-1].count("members") == 98
        assert not any("members" in txn for txn in kinds[:-2])  # the runs that did not fit: just before
        entries, _ = await store.get_prefix(prefix + "state/")
        assert {e.key.removeprefix(prefix + "state/"): e.value for e in entries} == record(rig)
        await journal.clear()
        assert (await store.get_prefix(prefix + "state/"))[0] == []
    with_store(make_store, body)


def test_transactions_of_hosts_and_workers_go_together_and_the_generation_after_them(make_store, prefix) -> None:
    """Half of a large job leaving is hundreds of transactions: those of hosts' and workers' keys
    alone are in flight together (a few at a time), one with a member run or the generation
    starts only once every transaction before it is in."""
    async def body(store):
        journal, rig = await _leading_journal(store, prefix, hosts=2400)
        await journal.save(record(rig))
        in_flight, most, started = [0], [0], []
        transact = store.transact

        async def watched(guards, puts, deletes, lease=None):
            kinds = {key.removeprefix(prefix + "state/").split("/")[0] for key in [*puts, *deletes]}
            started.append((kinds, in_flight[0]))
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            try:
                await asyncio.sleep(0.01)  # (a store's round trip, so that the ones sent together overlap)
                return await transact(guards, puts, deletes, lease=lease)
            finally:
                in_flight[0] -= 1
        store.transact = watched
        rig.set_hosts({f"h{i}": 1 for i in range(2400) if i % 2})
        rig.commit_at_update(list(rig.gen().member_ids), 2)
        await journal.save(record(rig))
        assert len(started) > MAX_TXN_IN_FLIGHT and 1 < most[0] <= MAX_TXN_IN_FLIGHT
        ordered = [(kinds, busy) for kinds, busy in started if kinds & {"members", "generation", "job"}]
        assert ordered and all(busy == 0 for _, busy in ordered)  # (nothing else in flight when each began)
        entries, _ = await store.get_prefix(prefix + "state/")
        assert {e.key.removeprefix(prefix + "state/"): e.value for e in entries} == record(rig)
    with_store(make_store, body)


def test_a_worker_record_is_data_its_environment_comes_from_the_resuming_job() -> None:
    rig, ids = running_job()
    values = record(rig)
    key = f"workers/{ids[0]}"
    # Someone with write access to the store plants variables in a worker's record: refused,
    # whether Ringmaster never sets them or sets them from the job's settings, not a worker's place.
    for name, value in (("LD_PRELOAD", "/tmp/evil.so"), ("RINGMASTER_CHECKPOINT_TRUSTED", "1"),
                        ("RINGMASTER_RENDEZVOUS", "evil:1")):
        planted = {**values[key]["place"], name: value}
        with pytest.raises(job_record.IncompatibleState, match=f"{name}, which is not a variable of its place"):
            job_record.read_job({**values, key: {**values[key], "place": planted}})
    # What is kept is its place in the ring; the rest of its environment is the resuming job's own.
    new = Rig(min_np=2, max_np=8)
    new.resume(job_record.read_job(values))
    env = new.coordinator.workers[ids[0]].env
    assert "RINGMASTER_CHECKPOINT_TRUSTED" not in env and env["RINGMASTER_RENDEZVOUS"] == "127.0.0.1:1"
    assert env["RANK"] == rig.coordinator.workers[ids[0]].env["RANK"]


def test_a_member_the_generation_does_not_list_is_refused() -> None:
    rig, ids = running_job()
    values = record(rig)
    stray = {**values[f"workers/{ids[0]}"]}
    with pytest.raises(job_record.IncompatibleState, match="members of no generation"):
        job_record.read_job({**values, f"workers/{ids[0][:-1]}99": stray})


# ---------------------------------------------------------------- drains across a takeover
def test_an_operators_drain_outlives_the_rendezvous_that_took_it() -> None:
    """A standby that takes the job over keeps the host out until the operator undrains it."""
    rig = Rig(min_np=1, max_np=8)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.drain_host("b", 30.0)
    rig.commit_at_update(ids, 1)
    rig.worker_exited("b", ids[1], 0, 0, False)
    values = record(rig)
    assert values["hosts/b"]["drain"]["done"] and values["hosts/b"]["drain"]["source"] == "operator"
    new = Rig(min_np=1, max_np=8)
    new.now = 500.0
    new.resume(job_record.read_job(values))
    new.agent_connected("a", 100, running=list(rig.specs("a")))
    new.agent_connected("b", 101, running=[])
    assert not new.specs("b"), "the drained host is given no workers"
    assert "b" not in [h.name for h in new.coordinator.pool.eligible_hosts(new.now)]
    assert new.coordinator.view(new.now).hosts[1].state == "drained"
    new.undrain_host("b")
    assert len(new.specs("b")) == 1, "undrained on the new rendezvous, the host takes a worker again"


def test_a_drain_under_way_gets_its_whole_deadline_again_on_the_new_clock() -> None:
    rig = Rig(min_np=1, max_np=8)
    ids = rig.start_elastic({"a": 1, "b": 1})
    rig.now = 20.0
    rig.drain_host("b", 30.0)  # (taken at 20 s: due at 50 s on the old clock)
    values = record(rig)
    assert values["hosts/b"]["drain"]["deadline_s"] == 30.0 and not values["hosts/b"]["drain"]["done"]
    new = Rig(min_np=1, max_np=8)
    new.now = 1000.0
    new.resume(job_record.read_job(values))
    new.agent_connected("a", 100, running=list(rig.specs("a")))
    new.agent_connected("b", 101, running=list(rig.specs("b")))
    drain = new.coordinator.pool.hosts["b"].drain
    assert (drain.requested_at, drain.deadline_at) == (1000.0, 1030.0)
    new.now = 1029.0
    new.tick()
    assert new.coordinator.workers[ids[1]].live, "not yet due"
    new.now = 1031.0
    new.tick()
    assert new.coordinator.workers[ids[1]].stopping, "past its deadline on the new clock: its worker is stopped"
    new.worker_exited("b", ids[1], -15, 0, False)
    (drained,) = [e.fields for e in new.coordinator.summary.events if e.kind is Kind.HOST_DRAINED]
    assert drained["outcome"] == "deadline", drained


@pytest.mark.parametrize("drain, message", [
    ({"source": "sabotage"}, "source"),
    ({"deadline_s": 1e12}, "deadline_s"),
    ({"deadline_s": -1}, "deadline_s"),
    ({"reason": "x" * 10_000}, "reason"),
    ({"incarnation": "i" * 1000}, "incarnation"),
    ({"run": "rm -rf /"}, "run"),
])
def test_a_drain_record_that_is_not_ours_is_refused_naming_the_field(drain, message) -> None:
    rig = Rig(min_np=1, max_np=8)
    rig.start_elastic({"a": 1, "b": 1})
    rig.drain_host("b", 30.0)
    values = record(rig)
    values["hosts/b"] = {**values["hosts/b"], "drain": {**values["hosts/b"]["drain"], **drain}}
    with pytest.raises(job_record.IncompatibleState, match=message):
        job_record.read_job(values)
