"""Hosts that join a pool by connecting: the board (who joined, what each is asked to run, what
each said of its jobs' agents), a job's launcher on it, and the pool API's host routes with the
keys they take. (tests/e2e/test_pool_agents.py runs real pool agents and jobs.)"""

from __future__ import annotations

import pathlib

import pytest
from fastapi.testclient import TestClient

from ringmaster.common.keys import agent_key, pool_host_key
from ringmaster.launch.launchers import AgentOptions
from ringmaster.rendezvous.pool.api import create_pool_app
from ringmaster.rendezvous.pool.board_launcher import BoardLauncher
from ringmaster.rendezvous.pool.host_board import BoardRefusal, HostBoard, Order
from ringmaster.rendezvous.pool.service import PoolService
from ringmaster.rendezvous.scheduling.model import Settings

JOIN = "join-secret-join-secret-join-secret"
ADMIN = "pool-secret-pool-secret-pool-secret-0"
OPTIONS = AgentOptions("127.0.0.1:5000", 1.0, 5.0)


def key_of(host: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {pool_host_key(JOIN, host).hex()}"}


def test_a_joined_host_is_a_source_of_slots_until_it_stops_polling() -> None:
    board = HostBoard(timeout_s=10)
    session, version = board.poll("h1", None, 4, [], [], now=100.0)
    assert board.find_hosts() == {"h1": 4} and version == 0
    assert board.poll("h1", session, 2, [], [], now=105.0) == (session, 0)
    assert board.find_hosts() == {"h1": 2}  # slots follow what the agent says
    assert board.lapse(114.0) == [] and board.lapse(115.5) == ["h1"]
    assert board.find_hosts() == {}


def test_the_time_the_pool_did_not_run_is_not_a_hosts_silence() -> None:
    board = HostBoard(timeout_s=10)
    board.poll("h1", None, 1, [], [], now=100.0)
    board.stalled(30.0)  # the pool was stopped from 101 to 131: h1's polls waited unread
    assert board.lapse(now=131.0) == [] and board.lapse(now=139.9) == []
    assert board.lapse(now=140.5) == ["h1"]  # silent for 10.5 s of the pool's running time: gone


def test_one_agent_per_host_name_and_bounded_reports() -> None:
    board = HostBoard(timeout_s=10)
    session, _ = board.poll("h1", None, 1, [], [], now=0.0)
    with pytest.raises(BoardRefusal, match="joined the pool already") as refused:
        board.poll("h1", None, 1, [], [], now=1.0)
    assert refused.value.status == 409
    other, _ = board.poll("h1", None, 1, [], [], now=20.0)  # the first one went quiet: a new agent takes over
    assert other != session
    for bad, match in ((("h 1", None, 1), "host name"), (("h2", None, 0), "slots"), (("h2", None, 1025), "slots")):
        with pytest.raises(BoardRefusal, match=match):
            board.poll(*bad, [], [], now=20.0)
    with pytest.raises(BoardRefusal, match="more than"):
        board.poll("h1", other, 1, ["x"] * 1025, [], now=20.0)


def test_orders_and_what_a_job_hears_of_its_agents() -> None:
    board = HostBoard(timeout_s=10)
    session, _ = board.poll("h1", None, 2, [], [], now=0.0)
    launcher = BoardLauncher(board, "job-1", OPTIONS, "job-secret-job-secret-0")
    launcher.start("h1")
    launcher.start("nowhere")  # a host with no agent: the order waits for it, then the job hears it ended
    version, (order,) = board.orders("h1", session, now=0.5)
    assert version == 1 and order.job == "job-1" and order.key == agent_key("job-secret-job-secret-0", "h1").hex()
    assert launcher.ended() == []
    board.timeout_s = 0.0
    assert board.lapse(now=0.0) == []  # (h1 reported just now: it stays)
    board.timeout_s = 10.0
    assert launcher.ended() == [("nowhere", "host nowhere has no pool agent connected (start `ringmaster pool agent` "
                                            "there)")]
    board.poll("h1", session, 2, [order.ident], [], now=1.0)
    assert launcher.alive() == 1
    launcher.stop("h1")
    assert board.orders("h1", session, now=0.5) == (2, [])
    assert launcher.alive() == 1  # withdrawn, but its agent still runs until the host says it ended
    board.poll("h1", session, 2, [], [(order.ident, "exited with code 0"), ("job-2@x:1", "made up")], now=2.0)
    assert launcher.alive() == 0 and launcher.ended() == [("h1", "exited with code 0")]
    assert board.take_ended(Order("job-2", AgentOptions("x:1", 1.0, 1.0),
                                  "").run) == []  # it speaks of its own orders only


def test_a_host_that_leaves_ends_its_jobs_agents_there() -> None:
    board = HostBoard(timeout_s=10)
    session, _ = board.poll("h1", None, 2, [], [], now=0.0)
    order = Order("job-1", OPTIONS, "00" * 32)
    board.order("h1", order)
    assert board.leave("h1", "not-the-session") is False
    assert board.leave("h1", session) is True
    ((host, how),) = board.take_ended(order.run)
    assert host == "h1" and "left the pool" in how and board.find_hosts() == {}


@pytest.fixture
def pool_api(tmp_path: pathlib.Path):
    board = HostBoard(timeout_s=10)
    pool = PoolService(board, "fifo", Settings(), {}, tmp_path, lambda kind, **fields: None, board=board,
                       join_secret=JOIN)
    return TestClient(create_pool_app(pool, ADMIN)), board


def test_a_host_proves_its_own_key_and_no_other(pool_api) -> None:
    client, board = pool_api
    body = {"slots": 2}
    assert client.post("/hosts/h1/poll", json=body, headers=key_of("h2")).status_code == 401
    assert client.post("/hosts/h1/poll", json=body, headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 401
    assert client.post("/hosts/h1/poll", json=body).status_code == 401
    answer = client.post("/hosts/h1/poll", json=body, headers=key_of("h1"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["orders"] == [] and board.find_hosts() == {"h1": 2}
    assert client.get("/jobs", headers=key_of("h1")).status_code == 401  # a host's key opens nothing else
    again = client.post("/hosts/h1/poll", json=body, headers=key_of("h1"))  # another agent for the same host
    assert again.status_code == 409 and "joined the pool already" in again.json()["detail"]


@pytest.mark.parametrize("body", [
    {"slots": 2.0}, {"slots": "2"}, {"slots": 0}, {"slots": 2, "extra": 1}, {"slots": 2, "running": "x"},
    {"slots": 2, "ended": [{"order": "x"}]}, {"slots": 2, "session": "s" * 65},
])
def test_malformed_polls_are_refused(pool_api, body) -> None:
    client, board = pool_api
    assert client.post("/hosts/h1/poll", json=body, headers=key_of("h1")).status_code == 422
    assert board.find_hosts() == {}


def test_a_poll_answers_with_the_hosts_orders_as_soon_as_they_change(pool_api) -> None:
    client, board = pool_api
    first = client.post("/hosts/h1/poll", json={"slots": 2}, headers=key_of("h1")).json()
    board.order("h1", Order("job-1", OPTIONS, "ab" * 32))
    answer = client.post("/hosts/h1/poll", json={"slots": 2, "session": first["session"], "version": first["version"]},
                         headers=key_of("h1")).json()
    (order,) = answer["orders"]
    assert answer["version"] == first["version"] + 1
    assert (order["job"], order["rendezvous"], order["key"]) == ("job-1", "127.0.0.1:5000", "ab" * 32)
    left = client.post("/hosts/h1/leave", json={"session": first["session"]}, headers=key_of("h1"))
    assert left.json() == {"left": True} and board.find_hosts() == {}


def test_a_job_launches_its_agent_on_a_host_again_only_once_the_last_one_ended() -> None:
    board = HostBoard(timeout_s=10)
    session, _ = board.poll("h1", None, 2, [], [], now=0.0)
    launcher = BoardLauncher(board, "job-1", OPTIONS, "job-secret-job-secret-0")
    launcher.start("h1")
    launcher.start("h1")  # its agent has not ended: nothing new
    _, (first,) = board.orders("h1", session, now=0.1)
    assert first.attempt == 1
    board.poll("h1", session, 2, [], [(first.ident, "exited with code 1")], now=0.2)
    assert launcher.ended() == [("h1", "exited with code 1")]
    launcher.start("h1")  # launched again: another order, which the host's agent runs anew
    _, (second,) = board.orders("h1", session, now=0.3)
    assert second.attempt == 2 and second.ident != first.ident


def test_the_pool_places_jobs_by_dominant_resource_fairness_on_what_joined_hosts_declare(tmp_path) -> None:
    """The pool service's round on a board: the hosts' declared GPUs and CPUs reach the policy,
    and its placement reaches the hosts as orders (each job's rendezvous runs for real on
    loopback; no agent process is started: the orders are only read)."""
    import asyncio
    import time

    async def scenario() -> tuple[dict, dict]:
        board = HostBoard(timeout_s=30)
        pool = PoolService(board, "fair", Settings(min_resize_interval_s=0, queue_weights={"qa": 1, "qb": 1}),
                           {"stop_grace_s": 0.2},
                           tmp_path, lambda kind, **fields: None, board=board)
        session, _ = board.poll("h1", None, 100, [], [], time.time(), {"cpu": 9.0, "gpu": 18.0})
        pool.pool_hosts.hosts = board.find_hosts()
        a = pool.submit(["python", "train.py"], 1, 100, "a", "qa", 0, {"cpu": 1.0, "gpu": 4.0})
        b = pool.submit(["python", "train.py"], 1, 100, "b", "qb", 0, {"cpu": 3.0})
        pool._schedule(time.time())
        placements = {job.id: dict(job.placement) for job in (a, b)}
        try:
            orders: dict = {}
            for _ in range(200):  # each job's rendezvous orders its agent on h1 once it listens
                _, given = board.orders("h1", session, time.time())
                orders = {order.job: order for order in given}
                if len(orders) == 2:
                    break
                await asyncio.sleep(0.05)
            return placements, orders
        finally:
            pool.stop()
            for lease in pool.leases.values():
                lease.server.request_stop("the test is over")
            await asyncio.gather(*(lease.task for lease in pool.leases.values()), return_exceptions=True)

    placements, orders = asyncio.run(scenario())
    assert placements == {"a-1": {"h1": 3}, "b-2": {"h1": 2}}  # equal dominant shares: 12/18 GPUs, 6/9 CPUs
    assert set(orders) == {"a-1", "b-2"} and orders["a-1"].key != orders["b-2"].key  # each job its own key


def test_a_worker_that_asks_for_what_no_host_declares_is_refused_at_submission(tmp_path) -> None:
    from ringmaster.common.errors import Refused
    from ringmaster.discovery import StaticDiscovery

    pool = PoolService(StaticDiscovery({"h": 4}), "fifo", Settings(), {}, tmp_path, lambda kind, **fields: None)
    pool.pool_hosts.board.poll("h", None, 4, [], [], 0.0, {"cpu": 2.0})  # its pool agent joined, with no GPU
    pool.pool_hosts.expected = pool.pool_hosts.hosts = {"h": 4}
    with pytest.raises(Refused, match="need 2 gpu; the pool's hosts declare 0 in all"):
        pool.submit(["python", "train.py"], 2, 2, None, "default", 0, {"gpu": 1.0})
    with pytest.raises(Refused, match="unknown resource 'tpu'"):
        pool.submit(["python", "train.py"], 1, 1, None, "default", 0, {"tpu": 1.0})


def test_a_job_that_asked_for_no_gpu_sees_none_on_a_host_that_has_some() -> None:
    from ringmaster.launch.launchers import LocalLauncher
    from ringmaster.rendezvous.pool.api import order_row
    from ringmaster.worker.agent.pool_agent import job_environment

    cpu_job = order_row(Order("cpu-job", OPTIONS, "ab" * 32))
    gpu_job = order_row(Order("gpu-job", OPTIONS, "ab" * 32, gpus_per_worker=1.0))
    assert job_environment(cpu_job, {"gpu": 4.0, "cpu": 32.0}) == {"CUDA_VISIBLE_DEVICES": ""}
    assert job_environment(gpu_job, {"gpu": 4.0}) == {} and job_environment(cpu_job, {"gpu": 0.0}) == {}
    launcher = LocalLauncher(OPTIONS, None, key="ab" * 32, environment=job_environment(cpu_job, {"gpu": 4.0}))
    assert launcher._environment()["CUDA_VISIBLE_DEVICES"] == ""  # what its agent process is started with


def test_what_a_host_says_of_one_run_of_a_job_never_reaches_the_next_run() -> None:
    board = HostBoard(timeout_s=10)
    session, _ = board.poll("h1", None, 2, [], [], now=0.0)
    first = BoardLauncher(board, "job-1", OPTIONS, "job-secret-job-secret-0")
    first.start("h1")
    _, (order,) = board.orders("h1", session, now=0.1)
    first.stop_all(0.0)  # the run ends (suspended) before the host said its agent ended
    resumed = BoardLauncher(board, "job-1", AgentOptions("127.0.0.1:6000", 1.0, 5.0), "job-secret-job-secret-1")
    resumed.start("h1")
    board.poll("h1", session, 2, [], [(order.ident, "exited with code 0")], now=0.2)  # late word of the first run
    assert resumed.ended() == [] and first.ended() == []


def test_an_agents_end_said_in_a_poll_overtaken_by_another_still_reaches_its_job() -> None:
    """Two polls of one host cross: the held one, built after the agent ended, does not list it as
    running and arrives first; the one saying it ended arrives next. The job must hear the end,
    or it waits forever to launch its agent on that host again (a CI run's job never grew back)."""
    board = HostBoard(timeout_s=10)
    session, _ = board.poll("h1", None, 2, [], [], now=0.0)
    launcher = BoardLauncher(board, "job-1", OPTIONS, "job-secret-job-secret-0")
    launcher.start("h1")
    version, (order,) = board.orders("h1", session, now=0.1)
    board.poll("h1", session, 2, [order.ident], [], now=0.2, applied=version)
    launcher.stop("h1")  # the job shrank off h1
    withdrawn, _ = board.orders("h1", session, now=0.3)
    board.poll("h1", session, 2, [], [], now=0.4)  # the overtaking poll (built before it applied the withdrawal)
    assert launcher.ended() == []
    board.poll("h1", session, 2, [order.ident], [(order.ident, "exited with code 0")], now=0.5, applied=withdrawn)
    assert launcher.ended() == [("h1", "exited with code 0")]
    launcher.start("h1")  # it grows back onto h1: a new order
    _, (again,) = board.orders("h1", session, now=0.6)
    assert again.attempt == 2


def test_an_order_withdrawn_before_the_hosts_agent_started_it_ends_once_the_host_acted_without_it() -> None:
    board = HostBoard(timeout_s=10)
    session, _ = board.poll("h1", None, 2, [], [], now=0.0)
    launcher = BoardLauncher(board, "job-1", OPTIONS, "job-secret-job-secret-0")
    launcher.start("h1")
    given, (order,) = board.orders("h1", session, now=0.1)
    launcher.stop("h1")  # withdrawn before the host's agent saw it
    withdrawn, _ = board.orders("h1", session, now=0.2)
    board.poll("h1", session, 2, [], [], now=0.3, applied=given)  # it has acted on the order, not yet on its withdrawal
    assert launcher.ended() == []
    board.poll("h1", session, 2, [order.ident], [], now=0.4, applied=withdrawn)  # it runs it: its end will come
    assert launcher.ended() == []
    board.poll("h1", session, 2, [], [(order.ident, "exited with code 0")], now=0.5, applied=withdrawn)
    assert launcher.ended() == [("h1", "exited with code 0")]
    launcher.start("h1")
    _, (second,) = board.orders("h1", session, now=0.6)
    launcher.stop("h1")
    after, _ = board.orders("h1", session, now=0.7)
    board.poll("h1", session, 2, [], [], now=0.8, applied=after)  # acted on orders without it, never ran it
    ((host, how),) = launcher.ended()
    assert host == "h1" and "never started it" in how
    board.poll("h1", session, 2, [], [(second.ident, "late")], now=0.9, applied=after)
    assert launcher.ended() == []  # each order ends once
