"""Agents the rendezvous launches itself (`ringmaster run`, a pool's jobs): what the end of one
that never connected means. Driven through the coordinator rig (no I/O)."""

from __future__ import annotations

from coordinator_rig import Rig

from ringmaster.rendezvous.control.effects import LaunchAgent, StopLaunchedAgent


def launching_rig() -> Rig:
    rig = Rig(min_np=1, max_np=4)
    rig.coordinator.pool.launches_agents = True  # (as `ringmaster run` with a launcher that starts agents)
    return rig


def test_an_agent_that_ended_before_connecting_makes_its_host_unreachable() -> None:
    rig = launching_rig()
    rig.set_hosts({"h1": 1, "h2": 1})
    assert sorted(e.host for e in rig.launches if isinstance(e, LaunchAgent)) == ["h1", "h2"]
    rig.agent_process_ended("h2", "ssh exited with code 255 before the agent connected: no route to host")
    assert rig.coordinator.pool.is_blacklisted("h2", rig.now)


def test_an_agent_asked_to_stop_before_it_connected_is_no_failure_and_its_host_can_come_back() -> None:
    rig = launching_rig()
    rig.set_hosts({"h1": 1, "h2": 1})
    rig.now = 1.0
    rig.set_hosts({"h1": 1})  # h2 left before its agent connected (a pool took it back at once)
    assert StopLaunchedAgent("h2") in rig.launches
    rig.agent_process_ended("h2", "host h2's pool agent never started it: the order was withdrawn first")
    assert not rig.coordinator.pool.is_blacklisted("h2", rig.now)
    rig.launches.clear()
    rig.now = 2.0
    rig.set_hosts({"h1": 1, "h2": 1})
    assert LaunchAgent("h2") in rig.launches
