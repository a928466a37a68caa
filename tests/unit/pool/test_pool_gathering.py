"""A pool that starts (or takes over) places no job until the hosts its source named have
joined, or --start-timeout passed: else the first host to join takes the first job at its
minimum and the stability rule holds it there while the others stand idle. The pool's round
runs for real (each job's rendezvous on loopback); no agent process is started."""

from __future__ import annotations

import asyncio
import pathlib
import time

from ringmaster.discovery import StaticDiscovery
from ringmaster.rendezvous.pool.service import PoolService
from ringmaster.rendezvous.scheduling.model import Settings

NAMED = {"a": 2, "b": 2}


def named_pool(tmp_path: pathlib.Path, start_timeout_s: float = 30.0) -> PoolService:
    pool = PoolService(StaticDiscovery(NAMED), "fifo", Settings(), {"stop_grace_s": 0.2,
                                                                    "start_timeout_s": start_timeout_s},
                       tmp_path, lambda kind, **fields: None)
    pool.pool_hosts.named(dict(NAMED), 1000.0)
    pool.pool_hosts.hosts = {"a": 2}  # a's pool agent joined; b's not yet
    return pool


def test_the_first_job_waits_for_every_named_host_and_starts_on_all_of_them(tmp_path) -> None:
    async def scenario() -> tuple[str, str, dict[str, int]]:
        pool = named_pool(tmp_path)
        job = pool.submit(["python", "train.py"], 2, 4, "j", "default", 0)
        pool._schedule(1001.0)
        waiting = (job.state, job.reason)
        pool.pool_hosts.hosts = dict(NAMED)  # b joined
        pool._schedule(1002.0)
        try:
            return waiting[0], waiting[1], dict(job.placement)
        finally:
            pool.stop()
            for lease in pool.leases.values():
                lease.server.request_stop("the test is over")
            await asyncio.gather(*(lease.task for lease in pool.leases.values()), return_exceptions=True)

    state, reason, placement = asyncio.run(scenario())
    assert state == "queued" and "waiting for the pool's host(s) b to join" in reason and "--start-timeout" in reason
    assert placement == {"a": 2, "b": 2}


def test_the_wait_ends_at_the_start_timeout_and_never_comes_back(tmp_path) -> None:
    pool = named_pool(tmp_path, start_timeout_s=30.0)
    assert pool.pool_hosts.gathering(1029.9) == ["b"]
    assert pool.pool_hosts.gathering(1030.0) == []
    pool.pool_hosts.hosts = {}  # a host lost later is the scheduler's business, not a reason to wait again
    assert pool.pool_hosts.gathering(1031.0) == []


def test_a_host_out_of_the_pool_is_not_waited_for(tmp_path) -> None:
    pool = named_pool(tmp_path)
    pool.pool_hosts.blacklisted["b"] = time.time() + 600  # its pool agent ended: out for the cooldown
    assert pool.pool_hosts.gathering(time.time()) == []


def test_hosts_that_join_by_connecting_are_never_waited_for(tmp_path) -> None:
    from ringmaster.rendezvous.pool.host_board import HostBoard

    board = HostBoard(timeout_s=10)
    pool = PoolService(board, "fifo", Settings(), {}, tmp_path, lambda kind, **fields: None, board=board)
    pool.pool_hosts.named({"a": 2, "b": 2}, 1000.0)
    pool.pool_hosts.hosts = {"a": 2}
    assert pool.pool_hosts.gathering(1001.0) == []
