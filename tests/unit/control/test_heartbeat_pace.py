"""Heartbeat intervals stretched with the job's size (`heartbeat_pace`), and what a caller keeps
of an answer that asks for one (`common.heartbeats`)."""

from __future__ import annotations

import math

from coordinator_rig import Rig
from hypothesis import given
from hypothesis import strategies as st

from ringmaster.common.heartbeats import MOST_INTERVAL_S, paced_interval
from ringmaster.rendezvous.control.heartbeat_pace import AGENT_BEATS_PER_S, WORKER_BEATS_PER_S, pace


def test_a_small_job_keeps_the_configured_interval() -> None:
    p = pace(1.0, 10.0, hosts=64, workers=512)
    assert (p.agent_s, p.worker_s, p.agent_timeout_s, p.worker_timeout_s) == (1.0, 1.0, 10.0, 10.0)


def test_a_large_job_is_held_to_the_budget_and_its_timeouts_stretch_alike() -> None:
    p = pace(1.0, 10.0, hosts=4096, workers=32768)
    assert math.isclose(4096 / p.agent_s, AGENT_BEATS_PER_S)
    assert math.isclose(32768 / p.worker_s, WORKER_BEATS_PER_S)
    assert math.isclose(p.agent_timeout_s / p.agent_s, 10.0) and math.isclose(p.worker_timeout_s / p.worker_s, 10.0)


@given(st.floats(0.05, 30), st.integers(0, 1 << 20), st.integers(0, 1 << 20))
def test_intervals_stay_between_the_configured_one_and_the_bound(interval: float, hosts: int, workers: int) -> None:
    p = pace(interval, interval * 10, hosts, workers)
    for s in (p.agent_s, p.worker_s):
        assert interval <= s <= max(interval, MOST_INTERVAL_S)


def test_a_caller_bounds_what_it_is_asked() -> None:
    assert paced_interval(0.0, 1.0) == 1.0  # nothing asked
    assert paced_interval(0.5, 1.0) == 1.0  # never faster than configured
    assert paced_interval(16.0, 1.0) == 16.0
    assert paced_interval(1e9, 1.0) == MOST_INTERVAL_S
    assert paced_interval(float("nan"), 1.0) == paced_interval(float("inf"), 1.0) == 1.0
    assert paced_interval(40.0, 1.0, most_s=10.0) == 10.0  # the agent's own bound (its reconnect window)


def test_the_coordinator_judges_silence_by_the_stretched_timeout() -> None:
    rig = Rig(min_np=1, heartbeat_interval_s=1.0, heartbeat_timeout_s=10.0)
    hosts = {f"h{i}": 1 for i in range(300)}  # 300 agents: 1.2 s between their heartbeats, 12 s of silence
    rig.start_elastic(hosts)
    rig.now = 5.0
    rig.tick()
    assert rig.coordinator.pace.agent_s == 300 / AGENT_BEATS_PER_S and rig.coordinator.pace.worker_s == 1.0
    for h in hosts:
        rig.agent_heartbeat(h)
    quiet, talking = "h0", [h for h in hosts if h != "h0"]
    silent_when_lost = None
    for step in range(1, 30):  # the clock runs as the rendezvous' does; h0 falls silent at 5 s
        rig.now = 5.0 + step * 0.5
        if step % 2 == 0:
            for h in talking:
                rig.agent_heartbeat(h)
        rig.tick()
        if silent_when_lost is None and not rig.coordinator.pool.hosts[quiet].agent_connected:
            silent_when_lost = rig.now - 5.0
    assert silent_when_lost is not None and 12.0 < silent_when_lost <= 13.0, silent_when_lost  # not at 10 s
    assert all(rig.coordinator.pool.hosts[h].agent_connected for h in talking)


def test_workers_beats_are_relayed_once_they_would_have_to_stretch() -> None:
    assert not pace(1.0, 10.0, hosts=125, workers=1000).relay  # their own beats still fit the budget
    p = pace(1.0, 10.0, hosts=126, workers=1008)
    assert p.relay and p.worker_timeout_s >= p.agent_timeout_s + 1.0  # heard as often as its agent, plus its own beat
    big = pace(1.0, 10.0, hosts=4096, workers=32768)
    assert big.relay and big.worker_timeout_s >= big.agent_timeout_s + 1.0
    assert pace(1.0, 10.0, hosts=2, workers=4, relay="always").relay
    assert pace(1.0, 10.0, hosts=2, workers=4, relay="always").worker_timeout_s == 11.0
    assert not pace(1.0, 10.0, hosts=4096, workers=32768, relay="never").relay


def test_a_relayed_beat_counts_from_when_the_agent_heard_it() -> None:
    rig = Rig(min_np=1, heartbeat_interval_s=1.0, heartbeat_timeout_s=10.0, heartbeat_relay="always")
    rig.start_elastic({"h0": 2})
    worker = next(iter(rig.coordinator.job.workers.values()))
    rig.now = 20.0
    rig.coordinator.worker_heartbeat(worker.worker_id, 3, True, rig.now, heard_at=17.5)
    assert worker.last_heartbeat == 17.5 and worker.commits == 3
    rig.coordinator.worker_heartbeat(worker.worker_id, 3, True, rig.now, heard_at=12.0)  # an older beat, late
    assert worker.last_heartbeat == 17.5  # never moved back
    rig.coordinator.worker_heartbeat(worker.worker_id, 3, True, rig.now, heard_at=99.0)  # (a broken agent's clock)
    assert worker.last_heartbeat == 20.0  # never into the future
    rig.now = 20.0 + rig.coordinator.pace.worker_timeout_s + 0.5
    rig.agent_heartbeat("h0")  # its agent beats on, carrying no beat of this worker's: it hangs
    rig.tick()
    assert not worker.live and "no heartbeat" in (worker.failed or ""), worker.failed


def test_the_pace_counts_the_hosts_discovered_not_only_those_connected_yet() -> None:
    # A large job's agents connect all at once: those first in must be asked for the stretched
    # beat (and given the long lease) from their first answer, or their beats wait behind the
    # flood of hellos and their leases run out: healthy hosts reset as a partition.
    rig = Rig(min_np=1, heartbeat_interval_s=1.0, heartbeat_timeout_s=10.0)
    rig.set_hosts({f"h{i}": 8 for i in range(1000)})
    rig.agent_connected("h0", 1)
    rig.tick()
    assert rig.coordinator.pace.agent_s == 1000 / AGENT_BEATS_PER_S
    assert rig.coordinator.pace.agent_timeout_s == 10.0 * 1000 / AGENT_BEATS_PER_S
