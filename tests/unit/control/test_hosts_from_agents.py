"""`--hosts-from-agents`: agents join the host set by connecting and leave it when they go.

Driven without I/O (a manual clock, the coordinator's outbox), as the gRPC layer drives it.
"""

from __future__ import annotations

from typing import Any, Mapping

from coordinator_rig import Rig, record

from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.effects import Retire, UpdateHosts
from ringmaster.rendezvous.state import job_record


def kinds(rig: Rig, kind: Kind) -> list[Mapping[str, Any]]:
    return [e.fields for e in rig.coordinator.summary.events if e.kind is kind]


def joined_rig(**settings) -> Rig:
    rig = Rig(hosts_from_agents=True, **settings)
    rig.set_hosts({})  # no listed hosts: every host joins by connecting
    return rig


def member_hosts(rig: Rig) -> list[str]:
    gen = rig.gen()
    assert gen is not None
    return [a.host for a in gen.members]


def register(rig: Rig, host: str) -> list[str]:
    ids = list(rig.specs(host))
    for wid in ids:
        rig.worker_connected(wid, 1)
        rig.worker_heartbeat(wid, 0, True)
    return ids


def test_an_agent_that_connects_joins_with_the_slots_it_declared_and_the_job_starts() -> None:
    rig = joined_rig(min_np=2)
    rig.agent_connected("a", 11, slots=1)
    assert rig.gen() is None  # 1 slot, --min-np 2: waits
    assert rig.coordinator.pool.hosts["a"].discovered and rig.coordinator.pool.hosts["a"].joined
    rig.agent_connected("b", 12, slots=3)
    assert sorted(member_hosts(rig)) == ["a", "b", "b", "b"]
    changed = kinds(rig, Kind.HOSTS_CHANGED)
    assert [c["added"] for c in changed] == [{"a": 1}, {"b": 3}]


def test_a_host_that_joins_a_running_job_grows_it_at_the_next_commit() -> None:
    rig = joined_rig(min_np=1)
    rig.agent_connected("a", 11, slots=1)
    first = register(rig, "a")
    assert member_hosts(rig) == ["a"]
    rig.agent_connected("b", 12, slots=2)
    newcomers = register(rig, "b")
    assert len(newcomers) == 2
    for wid in newcomers:
        rig.worker_ready(wid, 0, "", True)
    assert UpdateHosts in rig.kinds(first[0])  # the survivor is told at its next commit, not interrupted
    rig.worker_ready(first[0], 1, "", True)
    assert sorted(member_hosts(rig)) == ["a", "b", "b"]
    formed = kinds(rig, Kind.GENERATION_FORMED)[-1]
    assert "host_added" in formed["causes"] and "agents added b:2" in formed["cause"]


def test_an_agent_that_exits_without_workers_leaves_the_host_set_quietly() -> None:
    rig = joined_rig(min_np=1, max_np=1)
    rig.agent_connected("a", 11, slots=1)
    register(rig, "a")
    rig.agent_connected("b", 12, slots=1)  # --max-np 1: b runs nothing
    pool = rig.coordinator.pool
    assert pool.host_set() == {"a": 1, "b": 1} and not rig.specs("b")
    rig.agent_disconnected("b")
    assert pool.host_set() == {"a": 1} and not pool.hosts["b"].discovered
    assert [e["host"] for e in kinds(rig, Kind.HOST_LEFT)] == ["b"]
    assert not kinds(rig, Kind.HOST_LOST) and not pool.is_blacklisted("b", rig.now)
    assert kinds(rig, Kind.HOSTS_CHANGED)[-1]["removed"] == ["b"]


def two_hosts_training(rig: Rig) -> list[str]:
    """Hosts a and b joined, one worker each, both members of the ring."""
    rig.agent_connected("a", 11, slots=1)
    ids = register(rig, "a")
    rig.agent_connected("b", 12, slots=1)  # joins the running job: it grows at the next commit
    ids += register(rig, "b")
    rig.worker_ready(ids[1], 0, "", True)
    rig.worker_ready(ids[0], 1, "", True)
    assert sorted(member_hosts(rig)) == ["a", "b"]
    return ids


def test_a_lost_agent_is_a_lost_host_and_leaves_the_host_set() -> None:
    rig = joined_rig(min_np=1)
    ids = two_hosts_training(rig)
    rig.now = 1.0
    number = rig.gen().number
    rig.agent_disconnected("b")
    assert [e["host"] for e in kinds(rig, Kind.HOST_LOST)] == ["b"]
    assert "b" not in rig.coordinator.pool.host_set()
    rig.worker_ready(ids[0], number, "peer died", True)
    assert member_hosts(rig) == ["a"]


def test_a_drained_agent_leaves_at_the_commit_then_its_host_is_gone() -> None:
    rig = joined_rig(min_np=1)
    ids = two_hosts_training(rig)
    number = rig.gen().number
    rig.drain_host("b", 30.0)
    rig.commit_at_update(ids, number)
    assert rig.kinds(ids[1])[-1] == Retire
    rig.worker_exited("b", ids[1], 0, 0, False)
    rig.agent_disconnected("b")  # the drained agent exits
    assert "b" not in rig.coordinator.pool.host_set()
    assert not kinds(rig, Kind.HOST_LOST) and not rig.coordinator.pool.is_blacklisted("b", rig.now)
    assert member_hosts(rig) == ["a"]


def test_an_agent_reconnecting_keeps_its_host_and_its_slots() -> None:
    rig = joined_rig(min_np=1)
    rig.agent_connected("a", 11, slots=2)
    ids = register(rig, "a")
    rig.agent_connected("a", 11, running=ids, slots=2)  # the same agent, a new session
    assert rig.coordinator.pool.host_set() == {"a": 2}
    assert len(kinds(rig, Kind.HOSTS_CHANGED)) == 1


def test_discovery_and_joined_agents_together_discoverys_slots_win() -> None:
    rig = Rig(hosts_from_agents=True, min_np=1)
    rig.set_hosts({"a": 2})
    rig.agent_connected("a", 11, slots=8)  # listed: the list says 2
    rig.agent_connected("b", 12, slots=1)  # not listed: joins with its own
    assert rig.coordinator.pool.host_set() == {"a": 2, "b": 1}
    assert [h.name for h in rig.coordinator.pool.ordered_hosts()] == ["a", "b"]
    rig.agent_disconnected("a")  # a listed host stays listed (and is lost) when its agent goes
    assert "a" in rig.coordinator.pool.host_set()


def test_without_the_flag_declared_slots_change_nothing() -> None:
    rig = Rig(min_np=1)
    rig.set_hosts({"a": 1})
    rig.agent_connected("a", 11, slots=4)
    rig.agent_connected("x", 12, slots=4)
    assert rig.coordinator.pool.host_set() == {"a": 1}
    assert not rig.coordinator.pool.hosts["x"].discovered


def test_an_agent_before_the_first_discovery_is_in_the_first_host_set() -> None:
    rig = Rig(hosts_from_agents=True, min_np=2)
    rig.agent_connected("b", 12, slots=1)
    rig.set_hosts({"a": 1})
    assert rig.coordinator.pool.host_set() == {"a": 1, "b": 1}
    rig.agent_connected("a", 11)
    assert sorted(member_hosts(rig)) == ["a", "b"]


def test_joined_hosts_survive_a_takeover_and_leave_when_their_agent_does() -> None:
    rig = joined_rig(min_np=1)
    rig.agent_connected("a", 11, slots=1)
    rig.agent_connected("b", 12, slots=2)
    values = record(rig)
    assert values["hosts/b"]["joined"] is True
    saved = job_record.read_job(values)
    assert saved is not None
    standby = Rig(hosts_from_agents=True, min_np=1)
    standby.resume(saved)
    pool = standby.coordinator.pool
    assert pool.host_set() == {"a": 1, "b": 2} and pool.joined_hosts() == 2
    standby.set_hosts({})  # the standby's own discovery lists nothing: the joined hosts stay
    assert pool.host_set() == {"a": 1, "b": 2}
    standby.agent_connected("b", 12, slots=2)
    standby.agent_disconnected("b")
    assert pool.host_set() == {"a": 1}


def test_an_agent_of_another_version_is_warned_of_once_with_both_versions_named() -> None:
    """Mixed versions (an upgrade half done) may disagree on what messages mean: the job says so,
    naming the host and both versions, once per connection, and goes on with the host."""
    from ringmaster import __version__

    rig = joined_rig(min_np=1)
    rig.agent_connected("a", 11, slots=1, version=__version__)
    rig.agent_connected("b", 12, slots=1, version="0.1.9")
    rig.agent_connected("b", 12, slots=1, version="0.1.9")  # (the same agent again: its session was replaced)
    rig.agent_connected("c", 13, slots=1, version="")  # a build from before agents sent their version
    differs = kinds(rig, Kind.AGENT_VERSION_DIFFERS)
    assert [(d["host"], d["agent_version"], d["version"]) for d in differs] == [
        ("b", "0.1.9", __version__), ("c", "(older than 0.2.0: none sent)", __version__)]
    (event,) = [e for e in rig.coordinator.summary.events if e.kind is Kind.AGENT_VERSION_DIFFERS][:1]
    assert "0.1.9" in event.message and __version__ in event.message and "install one version" in event.message
    assert all(rig.coordinator.pool.hosts[h].joined for h in "abc")  # warned of, not refused
