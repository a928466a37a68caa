"""At most `MAX_PER_PEER` gRPC connections from one peer address: one neighbour cannot take the
connections every other host needs, however many it opens.

gRPC's server caps connections in all (`grpc_limits`) but knows no peers, so the rendezvous
looks from outside: once a second, when it holds more than `LOOK_ABOVE` descriptors, it reads
the kernel's table of TCP connections (`/proc/net/tcp`, `/proc/net/tcp6`), keeps those to its
gRPC port that are its own (their socket inodes are among its descriptors), and shuts down the
newest connections of any address beyond the limit (a socket's inode grows with its creation,
so the oldest, the agents' and workers' sessions, stay). Shutting a socket down through a
duplicate of its descriptor leaves the descriptor to gRPC, which sees the connection end and
closes it itself; the duplicate is checked to be that very socket first, so a descriptor reused
meanwhile is never touched. Linux only; elsewhere nothing is done.

The parsing and the choice are pure (`established`, `beyond_limit`); `shed` does the I/O.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from typing import Callable, Collection

#: Most connections to the gRPC port from one address (an agent and its workers need a few each;
#: a thousand simulated hosts of a benchmark share a few dozen).
MAX_PER_PEER = 512
#: The process' descriptors below which nobody is looked at (no peer can be over the limit).
LOOK_ABOVE = MAX_PER_PEER
#: Seconds between two looks.
CHECK_EVERY_S = 1.0
_ESTABLISHED = "01"


def _address(hex_address: str) -> str:
    """A /proc/net/tcp address (host byte order, hex) as text; IPv4-mapped IPv6 as IPv4."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped or address)


def established(table: str, port: int) -> list[tuple[str, int, int]]:
    """(remote address, remote port, socket inode) of the established connections to local
    `port` in a /proc/net/tcp or tcp6 table."""
    found = []
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _ESTABLISHED:
            continue
        local, remote, inode = fields[1], fields[2], fields[9]
        try:
            if int(local.rsplit(":", 1)[1], 16) != port:
                continue
            address, remote_port = remote.rsplit(":", 1)
            found.append((_address(address), int(remote_port, 16), int(inode)))
        except (ValueError, IndexError):
            continue
    return found


def beyond_limit(connections: list[tuple[str, int, int]], limit: int,
                 proven: Collection[tuple[str, int]] = ()) -> dict[str, list[int]]:
    """For each address with more than `limit` connections, the inodes of those beyond it: never
    a connection that carried a call proving one of the job's keys (`proven`: (address, port)),
    then the newest of the others first. (Socket inodes are handed out in per-CPU batches, so
    their order is creation order only roughly: an agent's long-lived session must not depend
    on it, and does not.)"""
    by_peer: dict[str, list[tuple[str, int, int]]] = {}
    for connection in connections:
        by_peer.setdefault(connection[0], []).append(connection)
    over = {}
    for peer, held in by_peer.items():
        if len(held) <= limit:
            continue
        kept = [c for c in held if (c[0], c[1]) in proven]
        others = sorted(c[2] for c in held if (c[0], c[1]) not in proven)
        over[peer] = others[max(0, limit - len(kept)):]
    return {peer: inodes for peer, inodes in over.items() if inodes}


def _our_sockets() -> dict[int, int]:
    """Socket inode -> descriptor, for this process' sockets."""
    sockets = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            sockets[int(target[8:-1])] = int(name)
    return sockets


def _shut_down(fd: int, inode: int) -> bool:
    """Shut the connection on `fd` down if `fd` is still the socket `inode`; the descriptor stays."""
    try:
        copy = os.dup(fd)
    except OSError:
        return False
    try:
        if os.fstat(copy).st_ino != inode:
            return False  # the descriptor was reused meanwhile: not ours to touch
        with socket.socket(fileno=copy) as sock:
            copy = -1  # closed with the socket object
            sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        if copy >= 0:
            os.close(copy)


def shed(port: int, limit: int = MAX_PER_PEER, proven: Collection[tuple[str, int]] = ()) -> dict[str, int]:
    """Shut down the connections to `port` beyond `limit` per peer address (never `proven` ones);
    how many per address."""
    connections: list[tuple[str, int, int]] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                connections += established(f.read(), port)
        except OSError:
            continue
    over = beyond_limit(connections, limit, proven)
    if not over:
        return {}
    ours = _our_sockets()
    shed_per_peer = {}
    for peer, inodes in over.items():
        count = sum(1 for inode in inodes if inode in ours and _shut_down(ours[inode], inode))
        if count:
            shed_per_peer[peer] = count
    return shed_per_peer


async def keep_peers_within(port: int, on_shed: Callable[[str, int], None], limit: int = MAX_PER_PEER,
                            proven: Callable[[], Collection[tuple[str, int]]] = lambda: ()) -> None:
    """Forever: once a second, when this process holds many descriptors, shed what any peer
    address holds beyond `limit`, sparing the connections `proven()` names (`on_shed(address,
    count)` hears of it)."""
    if not os.path.isdir("/proc/self/fd"):
        return
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        if len(os.listdir("/proc/self/fd")) <= LOOK_ABOVE:
            continue
        for peer, count in (await asyncio.to_thread(shed, port, limit, set(proven()))).items():
            on_shed(peer, count)
