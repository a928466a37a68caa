"""A job launched elastic is elastic from its first second (`JobSettings.elastic`), and a busy
worker's silence is not its death (`liveness`): the decisions, on a manual clock."""

from __future__ import annotations

import pytest
from coordinator_rig import Rig

from ringmaster.rendezvous.control.effects import EndGeneration
from ringmaster.rendezvous.control.liveness import judge_silence
from ringmaster.rendezvous.control.records import Phase


def planned(rig: Rig, hosts: dict[str, int]) -> list[str]:
    rig.set_hosts(hosts)
    for pid, host in enumerate(hosts, start=100):
        rig.agent_connected(host, pid)
    return [a.worker_id for a in rig.gen().members]


def test_a_failure_before_elastic_run_fails_a_plain_job_and_reforms_an_elastic_one() -> None:
    """The same start (no worker inside hvd.elastic.run yet; one killed by its silence): a plain
    job fails (--max-restarts 0), a job launched elastic re-forms without it and goes on."""
    for elastic in (False, True):
        rig = Rig(min_np=2, max_np=4, heartbeat_timeout_s=2, elastic=elastic)
        ids = planned(rig, {"a": 2, "b": 2})
        for wid in ids:
            rig.worker_connected(wid, 1)  # registered (hvd.init), not inside hvd.elastic.run
        for rig.now in (1.0, 2.2):  # ids[3] silent 2.2 s and its agent says nothing of it: hung or stopped
            for host in ("a", "b"):
                rig.agent_heartbeat(host)
            for wid in ids[:3]:
                rig.worker_heartbeat(wid, 0, False)
            rig.tick()
        assert "hung or stopped" in rig.coordinator.workers[ids[3]].failed
        rig.worker_exited("b", ids[3], 0, 15, True)
        outcome = rig.outcome()
        if not elastic:
            assert outcome is not None and not outcome.success and "--max-restarts 0" in outcome.message
            continue
        assert outcome is None
        for wid in ids[:3]:  # told the generation is over; not placed unasked (outside hvd.elastic.run)
            assert rig.last(wid, EndGeneration).generation == 1 and not rig.last(wid, EndGeneration).rejoin
        assert not any(rig.coordinator.workers[wid].stopping for wid in ids[:2])  # (b is blacklisted: b/3 leaves)
        for wid in ids[:3]:
            if not rig.coordinator.workers[wid].stopping:  # (b may be blacklisted: its worker leaves)
                rig.worker_ready(wid, 1, "", False)
        gen = rig.gen()
        assert gen is not None and gen.number == 2 and gen.member_ids[:2] == ids[:2]


def test_a_member_still_starting_is_not_stopped_nor_waited_for_and_joins_later() -> None:
    rig = Rig(min_np=2, max_np=3, elastic=True)
    ids = planned(rig, {"a": 3})
    rig.worker_connected(ids[0], 1)
    rig.worker_connected(ids[1], 1)  # ids[2] is still importing torch: not registered
    rig.worker_exited("a", ids[1], 0, 9, False)  # killed
    slow = rig.coordinator.workers[ids[2]]
    assert rig.outcome() is None and not slow.stopping and slow.phase is Phase.SPAWNING
    for rig.now in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):  # (the killed worker's exit status was had at once)
        rig.agent_heartbeat("a")
        rig.worker_heartbeat(ids[0], 0, False)
        rig.tick()
    rig.worker_ready(ids[0], 1, "peer gone", True)
    gen = rig.gen()
    assert gen is not None and gen.number == 1  # one ready worker is fewer than --min-np: wait for newcomers
    assert ids[2] not in {w.worker_id for w in rig.coordinator.live_workers() if w.phase is Phase.READY}
    newcomers = [w for w in rig.coordinator.live_workers() if w.worker_id not in ids]
    assert len(newcomers) == 1  # a replacement for the killed worker is started on its slot
    rig.worker_connected(ids[2], 1)  # it connects at last: told that its generation is over
    assert rig.last(ids[2], EndGeneration).generation == 1
    rig.worker_ready(ids[2], 1, "", True)  # and asks for the next, as a newcomer
    gen = rig.gen()
    assert gen is not None and gen.number == 2 and gen.member_ids == [ids[0], ids[2]]


def test_the_launch_decides_the_policy() -> None:
    from ringmaster.cli.main import build_parser, settings_from_args

    def elastic(*argv: str) -> bool:
        settings, _, _ = settings_from_args(build_parser().parse_args(["run", *argv, "python", "x.py"]))
        return settings.elastic

    assert not elastic("-np", "2")
    assert not elastic("--min-np", "2", "--max-np", "2")
    assert elastic("--min-np", "2", "--max-np", "4")
    assert elastic("-H", "localhost:2,127.0.0.1:2", "--min-np", "2")
    assert not elastic("-H", "localhost:2,127.0.0.1:2", "-np", "4")
    assert elastic("--hosts-from-agents", "-np", "2")


@pytest.mark.parametrize("silent, vouched, failed, busy", [
    (1.9, None, False, False),  # within --heartbeat-timeout: nothing to judge
    (2.5, None, True, False),  # silent, and its agent never said it was busy: hung or stopped
    (2.5, 1.5, False, True),  # its agent said it is busy within two of its beats: a busy interpreter
    (2.5, 2.5, True, False),  # the agent's word is too old: a SIGSTOP since then is found as before
    (119.0, 0.5, False, True),
    (121.0, 0.5, True, True),  # busy past --busy-timeout: hung in a C call, counted failed (no blame)
])
def test_a_silent_worker_is_judged_by_its_agents_word(silent, vouched, failed, busy) -> None:
    verdict = judge_silence(silent, vouched, timeout_s=2.0, busy_timeout_s=120.0, agent_beat_s=1.0)
    assert (verdict.failed, verdict.busy) == (failed, busy)
    assert bool(verdict.reason) == failed


@pytest.mark.parametrize("vouched, agent_silent, failed", [
    (3.0, 3.0, False),  # the agent's latest beat (3 s ago, late on a loaded host) named it: still busy
    (3.0, 2.0, True),  # the agent spoke since without naming it (stopped since): found as before
    (3.0, None, True),  # the agent is gone: its word is gone with it
    (6.5, 6.5, True),  # the agent itself is past its own heartbeat timeout (6 s)
])
def test_an_agents_latest_word_stands_until_it_speaks_again(vouched, agent_silent, failed) -> None:
    """Beside a CPU hog an agent's beat came 2 s late and two busy workers were counted dead."""
    verdict = judge_silence(4.0, vouched, timeout_s=2.0, busy_timeout_s=120.0, agent_beat_s=1.0,
                            agent_silent_s=agent_silent, agent_timeout_s=6.0)
    assert (verdict.failed, verdict.busy) == (failed, not failed)


def test_a_late_agent_beat_keeps_its_busy_workers_alive() -> None:
    rig = Rig(min_np=1, max_np=2, heartbeat_timeout_s=3, busy_timeout_s=30, elastic=True)
    ids = rig.start_elastic({"a": 1, "b": 1})
    start = rig.now
    rig.now = start + 1.0
    rig.agent_heartbeat("a")
    rig.agent_heartbeat("b")
    rig.workers_busy("b", [ids[1]])  # b's worker went silent at the start: busy
    for t in (2.0, 3.0, 3.5, 3.9):  # b's agent is 2.9 s late (within its own 3 s timeout)
        rig.now = start + t
        rig.agent_heartbeat("a")
        rig.worker_heartbeat(ids[0], int(t), True)
        rig.tick()
    assert rig.coordinator.workers[ids[1]].failed is None
    rig.now = start + 4.0
    rig.agent_heartbeat("b")  # b speaks again and does not name it: SIGSTOPped meanwhile
    for _ in range(3):
        rig.now += 1.0
        rig.agent_heartbeat("a")
        rig.agent_heartbeat("b")
        rig.worker_heartbeat(ids[0], int(rig.now), True)
        rig.tick()
    assert "hung or stopped" in (rig.coordinator.workers[ids[1]].failed or "")


def test_a_busy_worker_outlives_its_heartbeat_timeout_and_is_never_its_hosts_fault() -> None:
    rig = Rig(min_np=1, max_np=2, heartbeat_timeout_s=2, busy_timeout_s=10, elastic=True)
    ids = rig.start_elastic({"a": 1, "b": 1})
    for t in range(1, 12):
        rig.now = float(t)
        rig.agent_heartbeat("a")
        rig.agent_heartbeat("b")
        rig.worker_heartbeat(ids[0], t, True)
        rig.workers_busy("b", [ids[1]])  # b's worker holds the GIL: no beats of its own
        rig.workers_busy("b", [ids[0]])  # (an agent cannot vouch for another host's worker)
        rig.tick()
        assert (rig.coordinator.workers[ids[1]].failed is None) == (t <= 10), t
    assert "kept busy" in rig.coordinator.workers[ids[1]].failed
    assert not rig.coordinator.pool.blacklist.is_blacklisted("b", rig.now)


def test_a_member_that_connects_after_the_next_generation_formed_is_told_its_own_is_over() -> None:
    rig = Rig(min_np=1, max_np=2, elastic=True)
    ids = planned(rig, {"a": 2})
    rig.worker_connected(ids[0], 1)
    rig.worker_heartbeat(ids[0], 0, True)
    rig.worker_ready(ids[0], 1, "a peer's ring failed", True)  # ids[1], still starting, is not waited for
    gen = rig.gen()
    assert gen is not None and gen.number == 2 and gen.member_ids == [ids[0]]
    rig.worker_connected(ids[1], 1)
    assert rig.coordinator.workers[ids[1]].phase is Phase.WARMING
    assert rig.last(ids[1], EndGeneration).generation == 1  # its own generation: it joins the next as a newcomer


def test_a_plain_script_launched_elastic_still_restarts_as_a_whole() -> None:
    """torchrun's `--nnodes 1:4`: its workers never connect, so a failure restarts them all."""
    rig = Rig(min_np=2, max_np=4, elastic=True, max_restarts=0)
    ids = planned(rig, {"a": 3})
    rig.worker_exited("a", ids[0], 0, 9, False)  # killed; nobody ever connected
    assert rig.outcome() is None
    assert all(rig.coordinator.workers[wid].stopping for wid in ids[1:])
    for wid in ids[1:]:
        rig.worker_exited("a", wid, 0, 15, True)
    gen = rig.gen()
    assert gen is not None and gen.number == 2 and not set(gen.member_ids) & set(ids)  # planned afresh
