"""What a pool's host agent does with its orders, and which of its threads acts on them.

Stand-ins for the jobs' agents (they record `start`/`stop`) and for the pool (it answers polls):
the races these cover (a poll answer still in flight when SIGTERM comes; the thread that started
a job's agent ending before that agent drained) cannot be timed for real;
`tests/e2e/test_pool_agents.py` takes a host politely with real processes, and
`tests/unit/agent/test_processes.py` shows the kernel's part with a real process."""

from __future__ import annotations

import threading

import pytest

from ringmaster.common.api_client import ApiError
from ringmaster.common.pool_host_wire import OrderRow
from ringmaster.worker.agent import pool_agent
from ringmaster.worker.agent.pool_agent import PoolAgent, _Running


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


class _RecordingLauncher:
    """A job's agent that records which thread started and stopped it."""

    started_in: list[threading.Thread] = []
    stopped_in: list[threading.Thread] = []
    started = threading.Event()

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.agents: dict = {}

    def start(self, host: str) -> None:
        self.started_in.append(threading.current_thread())
        self.started.set()

    def alive(self) -> int:
        return 1

    def ended(self) -> list:
        return []

    def stop_all(self, timeout_s: float) -> None:
        self.stopped_in.append(threading.current_thread())


class _Pool:
    """Answers the first poll with one order; the next (held) poll asks the host agent to stop once
    the order was started, as SIGTERM would, then answers like a pool that is away."""

    api = "http://pool.invalid"

    def __init__(self) -> None:
        self.agent: PoolAgent | None = None
        self.polls = 0
        self.left = False

    def post(self, path: str, body: dict) -> dict:
        if path.endswith("/leave"):
            self.left = True
            return {}
        self.polls += 1
        if self.polls == 1:
            order = {"order": "o-1", "job": "job-1", "rendezvous": "127.0.0.1:1", "key": "0" * 64,
                     "heartbeat_interval_s": 1.0, "stop_grace_s": 5.0}
            return {"session": "s-1", "version": 1, "hold_s": 1.0, "timeout_s": 15.0, "orders": [order]}
        assert _RecordingLauncher.started.wait(10), "the order was not started within 10 s"
        assert self.agent is not None
        self.agent.stop_event.set()  # (what SIGTERM does; the main thread sees it within WATCH_S)
        raise ApiError("the pool is away", None)


def test_the_jobs_agents_are_started_and_stopped_by_the_thread_that_ends_last(monkeypatch: pytest.MonkeyPatch) -> None:
    # The jobs' agents die with the thread that started them (the kernel's parent-death signal):
    # the polling thread ends first on a stop, so it must never be the one that starts them.
    monkeypatch.setattr(_RecordingLauncher, "started_in", [])
    monkeypatch.setattr(_RecordingLauncher, "stopped_in", [])
    monkeypatch.setattr(_RecordingLauncher, "started", threading.Event())
    monkeypatch.setattr(pool_agent, "LocalLauncher", _RecordingLauncher)
    pool = _Pool()
    agent = PoolAgent(client=pool, host="hB", slots=1, say=lambda *a, **k: None, warm_ahead=False)  # type: ignore[arg-type]
    pool.agent = agent
    assert agent.run() == 0
    main = threading.current_thread()
    assert _RecordingLauncher.started_in == [main] and _RecordingLauncher.stopped_in == [main]
    assert pool.left and not agent.agents


class _EndedLauncher:
    """A job's agent that has ended (and says so once)."""

    def __init__(self) -> None:
        self.said = False

    def alive(self) -> int:
        return 0

    def ended(self) -> list:
        if self.said:
            return []
        self.said = True
        return [("hB", "exited with code 0")]


class _CrossingPool:
    """Answers polls; while the poll saying an agent ended is in flight, the other thread's held
    poll goes out too (two polls of one host cross, and either may reach the pool first)."""

    api = "http://pool.invalid"

    def __init__(self) -> None:
        self.agent: PoolAgent | None = None
        self.bodies: list[dict] = []

    def post(self, path: str, body: dict) -> dict:
        self.bodies.append(body)
        if body["ended"] and len(self.bodies) == 1:
            assert self.agent is not None
            self.agent.exchange(hold=True)  # the crossing poll, made while this one is out
        return {"session": "s-1", "version": 3, "hold_s": 1.0, "timeout_s": 15.0, "orders": []}


def test_a_poll_made_while_an_agents_end_is_on_its_way_still_lists_it_as_running() -> None:
    # The pool counts an order's end only when it hears it: a poll that overtook the one saying
    # it must not look like "never ran" (the job would then wait for an end that never comes).
    pool = _CrossingPool()
    agent, _ = _agent_running_one_job()
    agent.client = pool  # type: ignore[assignment]
    pool.agent = agent
    agent.agents["o-1"].launcher = _EndedLauncher()  # type: ignore[assignment]
    agent.exchange(hold=False)
    saying, crossing = pool.bodies[0], pool.bodies[1]
    assert saying["ended"] == [{"order": "o-1", "how": "exited with code 0"}]
    assert crossing["ended"] == [] and crossing["running"] == ["o-1"]
    agent.exchange(hold=True)  # once the pool has answered the poll that said it, it is gone
    assert pool.bodies[2]["running"] == [] and "o-1" in agent.done


def test_a_poll_says_which_version_of_the_orders_the_host_acted_on() -> None:
    pool = _CrossingPool()
    agent = PoolAgent(client=pool, host="hB", slots=1, say=lambda *a, **k: None, warm_ahead=False)  # type: ignore[arg-type]
    agent.exchange(hold=True)
    assert pool.bodies[0]["applied"] == -1
    agent.exchange(hold=True)  # the answer (version 3) is not acted on yet
    assert pool.bodies[1]["applied"] == -1
    agent.apply_received()
    agent.exchange(hold=True)
    assert pool.bodies[2]["applied"] == 3
