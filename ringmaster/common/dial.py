"""Reaching the rendezvous: the first of its addresses that answers, tried in turn with
backoff (`reconnect.Backoff`), for agents and workers alike."""

from __future__ import annotations

import threading

import grpc

from ringmaster.common import tls
from ringmaster.common.grpc_auth import Credentials, secured
from ringmaster.common.reconnect import Backoff

#: Answers that mean "the rendezvous is not there right now" (it restarted, failed over, or an
#: answer did not prove our key): agents and workers try again rather than give up.
AWAY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def dial(addresses: list[str], backoff: Backoff, stop: threading.Event,
         credentials: Credentials | None = None, ca_pem: bytes | None = None) -> tuple[str, grpc.Channel] | None:
    """A ready channel to the first listed address that answers, and that address. None when
    `backoff`'s deadline passes or `stop` is set: the caller tells the two apart. With
    `credentials`, every call on the channel is signed and its answers must prove the key too; with
    `ca_pem`, the channel is TLS and the rendezvous' certificate must chain to that CA."""
    while not stop.is_set():
        address = backoff.next_address(addresses)
        if address is None:
            return None
        channel = tls.channel(address, ca_pem)
        try:
            grpc.channel_ready_future(channel).result(timeout=backoff.connect_timeout_s)
        except grpc.FutureTimeoutError:
            channel.close()
            continue
        return address, secured(channel, credentials)
    return None
