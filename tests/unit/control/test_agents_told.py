"""What each host's agent is told to run (`Formation._publish_agents`) is what a look at every
worker says it runs, through a run of changes: the pass tells it from the census' lists and
skips a host whose list is the very one it told last, so a change it missed would go unsaid."""

from __future__ import annotations

from coordinator_rig import Rig

from ringmaster.rendezvous.control.effects import RunWorkers
from ringmaster.rendezvous.control.records import Phase


def _looked_at(rig: Rig, host: str) -> list[str]:
    """The workers `host` runs, from a look at every worker (the rule `_publish_agents` keeps)."""
    job = rig.coordinator.job
    grace = job.settings.stop_grace_s
    awaited = job.exit_awaited
    return [w.worker_id for w in job.workers.values() if w.host == host and (
        (w.live and (not w.stopping or (w.registered and rig.now - w.stop_requested_at < grace)))
        or (w.worker_id in awaited and w.phase is not Phase.EXITED))]


def _told(rig: Rig, host: str) -> list[str]:
    command = rig.agents.get(host)
    return [s.worker_id for s in command.workers] if isinstance(command, RunWorkers) else []


def _agents_told_as_looked_at(rig: Rig) -> None:
    for host in rig.coordinator.pool.hosts.values():
        if host.agent_connected:
            assert _told(rig, host.name) == _looked_at(rig, host.name), host.name


def test_each_agent_is_told_what_a_look_at_every_worker_says_through_changes() -> None:
    rig = Rig(min_np=1, stop_grace_s=5.0)
    ids = rig.start_elastic({"a": 2, "b": 2, "c": 2})
    _agents_told_as_looked_at(rig)
    rig.now = 1.0
    told = _told(rig, "b")
    rig.worker_exited("b", ids[2], 1, 0, False)  # a worker crashes
    _agents_told_as_looked_at(rig)
    assert _told(rig, "b") != told
    rig.now = 2.0
    rig.set_hosts({"a": 2, "b": 2})  # c leaves the job: its workers retire at their next commit
    _agents_told_as_looked_at(rig)
    gen = rig.gen()
    assert gen is not None
    rig.commit_at_update(list(gen.member_ids), gen.number)
    _agents_told_as_looked_at(rig)
    rig.now = 9.0
    rig.tick()  # their grace is over: no longer run
    _agents_told_as_looked_at(rig)
    assert _told(rig, "c") == []
    before = rig.agents["a"]
    rig.tick()
    assert rig.agents["a"] is before  # nothing changed: nothing told again
    rig.agent_connected("a", 200, running=_told(rig, "a"))  # the same agent's new session: told again, whole
    assert rig.agents["a"] is not before and _told(rig, "a") == _looked_at(rig, "a")
    before = rig.agents["a"]
    rig.agent_disconnected("a")
    rig.agent_connected("a", 201, running=_looked_at(rig, "a"))  # lost, then back
    assert rig.agents["a"] is not before
    _agents_told_as_looked_at(rig)


def test_a_new_session_of_an_agent_is_told_again_though_its_workers_are_the_same() -> None:
    """The pass skips a host whose workers' list is the one it told last, but not once a new
    session of its agent forgot what it was told (`sent_to_agents`)."""
    rig = Rig(min_np=1)
    rig.start_elastic({"a": 2, "b": 2})
    before = rig.agents["a"]
    running = rig.coordinator.job.census().running["a"]
    rig.tick()
    assert rig.agents["a"] is before
    rig.agent_connected("a", 200, running=_told(rig, "a"))
    assert rig.coordinator.job.census().running["a"] is running  # (the very list: nothing else changed)
    assert rig.agents["a"] is not before and _told(rig, "a") == _looked_at(rig, "a")
