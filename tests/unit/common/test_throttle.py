"""Refused calls slowed per peer address (pure: the time is passed in)."""

from __future__ import annotations

from ringmaster.common.throttle import RefusalThrottle, peer_address
from ringmaster.rendezvous.server.grpc_limits import max_connections


def test_a_peer_gets_its_burst_at_once_then_two_refusals_a_second() -> None:
    throttle = RefusalThrottle(burst=5, per_second=2.0)
    assert [throttle.delay("10.0.0.1", 100.0) for _ in range(5)] == [0.0] * 5
    assert throttle.delay("10.0.0.1", 100.0) == 0.5  # the bucket is empty
    assert throttle.delay("10.0.0.2", 100.0) == 0.0  # another peer has its own
    assert [throttle.delay("10.0.0.1", 101.0) for _ in range(3)] == [0.0, 0.0, 0.5]  # refilled by two in a second
    assert throttle.slowed == 2


def test_waiting_refusals_and_remembered_peers_are_bounded() -> None:
    throttle = RefusalThrottle(burst=1, per_second=1.0, max_peers=3, max_waiting=2)
    throttle.delay("a", 0.0)
    throttle.waiting = 2  # two refusals are being slowed now
    assert throttle.delay("a", 0.0) == 0.0  # no more wait: answered at once
    for peer in ("b", "c", "d"):
        throttle.delay(peer, 0.0)
    assert len(throttle._buckets) == 3 and "a" not in throttle._buckets


def test_peer_addresses_leave_out_the_port() -> None:
    assert peer_address("ipv4:10.0.0.1:5000") == "10.0.0.1"
    assert peer_address("ipv6:[::1]:5000") == "::1"
    assert peer_address("unix:/tmp/s") == "unix:/tmp/s"


def test_grpc_keeps_half_the_descriptors_left_after_a_reserve() -> None:
    assert max_connections(20_000) == (20_000 - 1024) // 2
    assert max_connections(1024) == 64  # never fewer
    assert max_connections(1 << 20) == 40_000  # never more
