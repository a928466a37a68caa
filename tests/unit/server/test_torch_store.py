"""The rings' TCPStores: their ports are known at once, torch's store serves them once made, and
a store that cannot be made is reported (the job is aborted with it, not left to time out)."""

from __future__ import annotations

import os
import socket
import threading
from datetime import timedelta

import pytest

from ringmaster.rendezvous.server.torch_store import TorchStoreHost

WAIT_S = 60.0


def test_the_port_listens_before_the_store_is_made_and_torch_serves_it_once_made() -> None:
    release = threading.Event()
    made: list[int] = []

    def slow_maker(host: str, fd: int, timeout: timedelta):
        assert release.wait(WAIT_S), "never released"
        from ringmaster.rendezvous.server.torch_store import torch_tcp_store

        made.append(fd)
        return torch_tcp_store(host, fd, timeout)

    stores = TorchStoreHost(make_store=slow_maker, timeout_s=WAIT_S)
    try:
        assert stores.port > 0 and not stores.tcp_store.done()
        early = socket.create_connection(("127.0.0.1", stores.port), timeout=WAIT_S)  # queued in the backlog
        early.close()
        host, plain_port = stores.plain_store(1)
        assert host == "127.0.0.1" and plain_port not in (0, stores.port)
        release.set()
        stores.ready(WAIT_S)
        assert len(made) == 2 and stores.problem() is None

        import torch.distributed as dist

        for port in (stores.port, plain_port):
            client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=WAIT_S))
            client.set("key", "value")
            assert client.get("key") == b"value"
    finally:
        release.set()
        stores.close()


def test_a_store_that_cannot_be_made_is_named_and_its_socket_closed() -> None:
    def failing_maker(host: str, fd: int, timeout: timedelta):
        raise OSError("no more descriptors")

    stores = TorchStoreHost(make_store=failing_maker)
    try:
        with pytest.raises(OSError):
            stores.ready(WAIT_S)
        problem = stores.problem()
        assert problem is not None and "TCPStore" in problem and "no more descriptors" in problem
        with pytest.raises(ConnectionRefusedError):  # the listener was closed, not leaked
            socket.create_connection(("127.0.0.1", stores.port), timeout=WAIT_S)
    finally:
        stores.close()


def test_only_the_last_plain_stores_are_kept() -> None:
    def closing_maker(host: str, fd: int, timeout: timedelta) -> str:
        os.close(fd)  # (no server: only the bookkeeping is under test)
        return host

    stores = TorchStoreHost(make_store=closing_maker)
    try:
        ports = [stores.plain_store(generation)[1] for generation in range(5)]
        stores.ready(WAIT_S)
        assert len(set(ports)) == 5 and list(stores._plain) == [3, 4]
    finally:
        stores.close()
