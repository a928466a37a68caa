"""Refused calls are answered slowly once a peer has had many: a flood of forged or replayed calls
costs its sender time, not the rendezvous' CPU or its log.

Per peer address (its IP, whatever the port): a bucket of `burst` refusals that refills at
`per_second`. While a peer's bucket holds some, its refusals are answered at once; once it is
empty, each further refusal waits `1 / per_second` seconds before it is answered (at most
`max_waiting` at once; beyond that they are answered at once, so waiting refusals hold no more
than that many calls). Only refusals are throttled: a peer's good calls (its host's agent and
workers share its address) are never slowed. Pure: the time is passed in.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict

#: Refusals a peer gets answered at once before they are slowed down.
DEFAULT_BURST = 20
#: Refusals per second a peer gets answered at once after its burst.
DEFAULT_PER_SECOND = 2.0
#: Peers remembered (least recently refused ones are forgotten first).
MAX_PEERS = 4096
#: Slowed refusals waiting at once.
MAX_WAITING = 256


def peer_address(peer: str) -> str:
    """The address part of a gRPC peer string (`ipv4:10.0.0.1:5000` -> `10.0.0.1`)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition("]")[0].lstrip("[") or rest
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    return peer  # unix sockets and the like: the whole string


def peer_endpoint(peer: str) -> tuple[str, int] | None:
    """(address, port) of a gRPC peer string (`ipv4:10.0.0.1:5000`, `ipv6:[::ffff:10.0.0.1]:5000`,
    an IPv4-mapped address given as IPv4, as the kernel's tables read); None for anything else."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    address, _, port = rest.rpartition(":")
    try:
        parsed = ipaddress.ip_address(address.strip("[]"))
        mapped = parsed.ipv4_mapped if isinstance(parsed, ipaddress.IPv6Address) else None
        return str(mapped or parsed), int(port)
    except ValueError:
        return None


class ProvenConnections:
    """The connections (address, port) that lately carried a call proving one of the job's keys:
    the per-peer connection limit never sheds them. Bounded: the least recently proven are
    forgotten first."""

    def __init__(self, capacity: int = MAX_PEERS * 4) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()

    def note(self, peer: str) -> None:
        endpoint = peer_endpoint(peer)
        if endpoint is None:
            return
        self._seen[endpoint] = None
        self._seen.move_to_end(endpoint)
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def snapshot(self) -> frozenset[tuple[str, int]]:
        return frozenset(self._seen)


class RefusalThrottle:
    def __init__(self, burst: int = DEFAULT_BURST, per_second: float = DEFAULT_PER_SECOND,
                 max_peers: int = MAX_PEERS, max_waiting: int = MAX_WAITING) -> None:
        self.burst = burst
        self.per_second = per_second
        self.max_peers = max_peers
        self.max_waiting = max_waiting
        self.waiting = 0  # refusals being slowed now (the caller counts them in and out)
        self.slowed = 0  # refusals slowed so far
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()  # peer -> [tokens, last refill]

    def delay(self, peer: str, now: float) -> float:
        """Seconds to wait before answering a refusal to `peer` (0: at once); takes one from its bucket."""
        bucket = self._buckets.get(peer)
        if bucket is None:
            if len(self._buckets) >= self.max_peers:
                self._buckets.popitem(last=False)
            bucket = self._buckets[peer] = [float(self.burst), now]
        else:
            bucket[0] = min(float(self.burst), bucket[0] + (now - bucket[1]) * self.per_second)
            bucket[1] = now
            self._buckets.move_to_end(peer)
        if bucket[0] >= 1.0:
            bucket[0] -= 1.0
            return 0.0
        if self.waiting >= self.max_waiting:
            return 0.0
        self.slowed += 1
        return 1.0 / self.per_second
