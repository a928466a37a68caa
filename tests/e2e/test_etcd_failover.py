"""An etcd cluster is only as available as its client: a member that dies must not stop the
rendezvous while a quorum of the others serves. Real three-member etcd clusters on loopback;
the member killed is etcd's raft leader, the harder case (the cluster elects anew while the
client moves on).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import pytest
from etcd_server import EtcdCluster, EtcdServer
from harness import discovery_script, elastic_job, events, read_logs, wait_for, write_hosts
from job_checks import assert_every_sample_once

from ringmaster.common.events import Event, Kind
from ringmaster.rendezvous.state.etcd_kv import EtcdStore
from ringmaster.rendezvous.state.kv import StoreUnavailable

PREFIX = "/failover/"


def raft_leader_first(cluster: EtcdCluster) -> list[EtcdServer]:
    """The members with etcd's raft leader first: a client connects to it, and it is killed."""
    leader = cluster.raft_leader()
    return [leader] + [m for m in cluster.members if m is not leader]


async def until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        await asyncio.sleep(0.02)


def test_the_store_moves_to_another_member_and_its_watch_resumes_there(etcd_cluster) -> None:
    members = raft_leader_first(etcd_cluster)
    victim = members[0]

    async def main() -> None:
        said: list[Event] = []
        store = await EtcdStore.connect([m.endpoint for m in members], timeout_s=2, log=said.append)
        seen: list[str] = []

        async def follow(revision: int) -> None:
            while True:
                try:
                    async for change in store.watch_prefix(PREFIX, revision):
                        seen.append(change.key.removeprefix(PREFIX))
                        revision = change.revision + 1
                except StoreUnavailable:
                    await asyncio.sleep(0.05)

        try:
            assert store.endpoint == victim.address
            revision = await store.put(PREFIX + "a", {"n": 1})
            watcher = asyncio.create_task(follow(revision))
            await until(lambda: seen == ["a"], 10, "the watch to see 'a'")
            victim.kill()
            await store.put(PREFIX + "b", {"n": 2})  # no error reaches the caller: the store moved on
            assert store.endpoint != victim.address
            assert said[0].kind is Kind.STORE_FAILOVER and said[0].fields["previous"] == victim.address, said
            lease = await store.grant_lease(5)
            assert await store.refresh_lease(lease)
            entries, _ = await store.get_prefix(PREFIX)
            assert [(e.key, e.value) for e in entries] == [(PREFIX + "a", {"n": 1}), (PREFIX + "b", {"n": 2})]
            # The watch broke with its member and resumed from its revision on another one:
            # nothing missed, nothing seen twice.
            await until(lambda: seen == ["a", "b"], 10, "the resumed watch to see 'b'")
            watcher.cancel()
            for member in members[1:]:
                member.kill()
            with pytest.raises(StoreUnavailable) as caught:
                await store.put(PREFIX + "c", {"n": 3})
            for member in members:
                assert member.address in str(caught.value)
        finally:
            await store.close()
    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.slow
def test_a_job_carries_on_when_the_etcd_member_its_rendezvous_uses_dies(run_job, etcd_cluster, tmp_path) -> None:
    members = raft_leader_first(etcd_cluster)
    url = "etcd://" + ",".join(m.address for m in members) + "/jobs/cluster"
    script, hosts_file = discovery_script(tmp_path, {"hostA": 1, "hostB": 1})
    job = run_job("--min-np", "1", "--host-discovery-script", script, "--store", url,
                  "--discovery-interval", "0.3", "--warmup-grace", "10", "--start-timeout", "20",
                  *elastic_job(tmp_path / "log", epochs=4, samples=96))
    wait_for(lambda: len(events(read_logs(tmp_path / "log"), "commit")) >= 10, 120, "training to commit steps")
    members[0].kill()
    job.wait_event("store.failover", 30, previous=members[0].address)
    # Membership still changes, through the members that are left: a host leaves discovery.
    write_hosts(hosts_file, {"hostA": 1})
    job.wait_event("generation.formed", 60, number=2, size=1)
    assert job.wait(240) == 0, job.output
    assert not job.events("store.degraded") and not job.events("leader.deposed"), job.output
    assert_every_sample_once(read_logs(tmp_path / "log"), 4)

    async def state_keys() -> list[str]:
        store = await EtcdStore.connect([m.endpoint for m in members[1:]])
        try:
            return [e.key for e in (await store.get_prefix("/jobs/cluster/state/"))[0]]
        finally:
            await store.close()
    assert asyncio.run(state_keys()) == []  # the job's last writes reached the cluster: it left no keys
