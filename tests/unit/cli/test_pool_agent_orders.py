"""What a pool's host agent does with its orders while the host is being taken politely.

A stand-in for the jobs' agents (it records `stop`): the race this covers, a poll answer still in
flight when SIGTERM comes that no longer lists a job the pool moved off the draining host, cannot
be timed for real; `tests/e2e/test_pool_agents.py` takes a host politely with real processes."""

from __future__ import annotations

from ringmaster.cli.pool_agent import PoolAgent, _Running
from ringmaster.rendezvous.pool.host_wire import OrderRow


class _Launcher:
    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop(self, host: str) -> None:
        self.stopped.append(host)


def _agent_running_one_job() -> tuple[PoolAgent, _Launcher]:
    agent = PoolAgent(client=None, host="hB", slots=1, say=lambda *a, **k: None, warm_ahead=False)  # type: ignore[arg-type]
    order = OrderRow(order="o-1", job="job-1", rendezvous="127.0.0.1:1", key="0" * 64, heartbeat_interval_s=1.0,
                     stop_grace_s=5.0)
    launcher = _Launcher()
    agent.agents["o-1"] = _Running(order, launcher)  # type: ignore[arg-type]
    return agent, launcher


def test_an_order_taken_off_the_host_stops_its_jobs_agent() -> None:
    agent, launcher = _agent_running_one_job()
    agent.apply([])
    assert launcher.stopped == ["hB"] and agent.agents["o-1"].stopping


def test_while_the_host_is_taken_politely_no_answer_stops_a_draining_jobs_agent() -> None:
    agent, launcher = _agent_running_one_job()
    agent.stop_event.set()  # SIGTERM: `stop_all` drains every job's agent
    agent.apply([])
    assert launcher.stopped == [] and not agent.agents["o-1"].stopping
