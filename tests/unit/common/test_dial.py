"""Dialing the rendezvous again after it came back, while the old channel to it still backs off."""

from __future__ import annotations

import socket
import threading
from concurrent import futures

import grpc
import pytest
from harness import free_port

from ringmaster.common import tls
from ringmaster.common.dial import dial
from ringmaster.common.reconnect import Backoff


def _server(address: str) -> grpc.Server:
    """A real gRPC server on `address` (one method; dial only needs it to accept)."""
    handler = grpc.method_handlers_generic_handler("t.T",
                                                   {"M": grpc.unary_unary_rpc_method_handler(lambda r, c: b"ok")})
    server = grpc.server(futures.ThreadPoolExecutor(1))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(address)
    server.start()
    return server


def _wait_until_it_notices(channel: grpc.Channel, deadline_s: float = 10.0) -> None:
    """Wait until `channel` has seen its server go: `stop(0).wait()` returns before the client's
    transport reads the server's GOAWAY, and a channel still READY then (2 of 40 times on a loaded
    2-core machine) would make the backoff below look like no backoff at all."""
    gone = threading.Event()

    def seen(state: grpc.ChannelConnectivity) -> None:
        if state is not grpc.ChannelConnectivity.READY:
            gone.set()

    channel.subscribe(seen)
    try:
        assert gone.wait(deadline_s), f"the channel still says READY {deadline_s} s after its server stopped"
    finally:
        channel.unsubscribe(seen)


@pytest.mark.slow  # (6 s of a real channel's backoff: with the end-to-end tests)
def test_a_dial_after_the_rendezvous_came_back_does_not_wait_for_the_old_channels_backoff() -> None:
    address = f"127.0.0.1:{free_port()}"
    server = _server(address)
    old = tls.channel(address, None)
    assert old.unary_unary("/t.T/M")(b"x", timeout=10) == b"ok"
    server.stop(0).wait()
    _wait_until_it_notices(old)
    # The port stays ours while the rendezvous is away (bound, not listening: a connection is
    # refused as with nobody there), or a test running beside this one may be given it.
    placeholder = socket.socket()
    placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    placeholder.bind(("127.0.0.1", int(address.rsplit(":", 1)[1])))
    try:
        # The old channel keeps trying while the rendezvous is away (as a worker's heartbeats do):
        # after failures at about 0, 1, 2.6 and 5.2 s its next try is 3.3-4.9 s later (1.6-fold, +-20%).
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(old).result(timeout=5.5)
    finally:
        placeholder.close()
    server = _server(address)
    try:
        # One round of one try (a 1 s connect timeout, no second round): a channel sharing the old
        # one's connection would still be waiting out that backoff and come back empty.
        dialed = dial([address], Backoff(timeout_s=0.0), threading.Event())
        assert dialed is not None, "the dial waited behind the old channel's backoff"
        assert dialed[1].unary_unary("/t.T/M")(b"x", timeout=10) == b"ok"
        dialed[1].close()
    finally:
        old.close()
        server.stop(0)
