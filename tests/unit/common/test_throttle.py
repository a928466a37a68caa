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


def test_connections_beyond_the_limit_per_peer_are_the_newest_ones() -> None:
    from ringmaster.rendezvous.server.peer_limit import beyond_limit, established

    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:1F90 0100007F:D43E 01 00000000:00000000 00:00000000 00000000 0 0 105 1 0\n"
        "   1: 0100007F:1F90 0200007F:D43F 01 00000000:00000000 00:00000000 00000000 0 0 101 1 0\n"
        "   2: 0100007F:1F90 0200007F:D440 01 00000000:00000000 00:00000000 00000000 0 0 103 1 0\n"
        "   3: 0100007F:1F90 0200007F:D441 01 00000000:00000000 00:00000000 00000000 0 0 102 1 0\n"
        "   4: 0100007F:1F90 0200007F:D442 0A 00000000:00000000 00:00000000 00000000 0 0 104 1 0\n"  # listening
        "   5: 0100007F:0050 0200007F:D443 01 00000000:00000000 00:00000000 00000000 0 0 106 1 0\n"  # another port
        "   6: garbage\n"
    )
    connections = established(table, 0x1F90)
    assert connections == [("127.0.0.1", 0xD43E, 105), ("127.0.0.2", 0xD43F, 101), ("127.0.0.2", 0xD440, 103),
                           ("127.0.0.2", 0xD441, 102)]
    assert beyond_limit(connections, 2) == {"127.0.0.2": [103]}  # the newest (inodes grow with creation)
    # A connection that proved a key is never shed, however new: the others make room around it.
    assert beyond_limit(connections, 2, {("127.0.0.2", 0xD440)}) == {"127.0.0.2": [102]}
    assert beyond_limit(connections, 1, {("127.0.0.2", 0xD440)}) == {"127.0.0.2": [101, 102]}
    six = ("  sl  local_address remote_address st ...\n"
           "   0: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000200007F:D43E 01 0:0 0:0 0 0 0 7 1\n"
           "   1: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:D43F 01 0:0 0:0 0 0 0 8 1\n")
    assert established(six, 0x1F90) == [("127.0.0.2", 0xD43E, 7), ("::1", 0xD43F, 8)]


def test_proven_connections_are_read_from_grpc_peers_and_bounded() -> None:
    from ringmaster.common.throttle import ProvenConnections, peer_endpoint

    assert peer_endpoint("ipv4:10.0.0.1:5000") == ("10.0.0.1", 5000)
    assert peer_endpoint("ipv6:[::ffff:127.0.0.1]:6000") == ("127.0.0.1", 6000)
    assert peer_endpoint("ipv6:[::1]:7") == ("::1", 7)
    assert peer_endpoint("unix:/tmp/x") is None and peer_endpoint("ipv4:nonsense") is None
    proven = ProvenConnections(capacity=2)
    for peer in ("ipv4:10.0.0.1:1", "ipv4:10.0.0.1:2", "ipv4:10.0.0.1:1", "ipv4:10.0.0.1:3"):
        proven.note(peer)
    assert proven.snapshot() == {("10.0.0.1", 1), ("10.0.0.1", 3)}  # the least recently proven went
