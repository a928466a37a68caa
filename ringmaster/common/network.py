"""This machine's names and addresses: which host names are this machine, and which of its
addresses others can dial.

A job on several machines must advertise an address the other hosts reach. horovodrun's answer
is a network interface (`--network-interface`); without one, the address this machine uses to
reach a given host is found by asking the kernel for the route (a UDP socket's `connect` sends
nothing). Linux only for interface addresses (`SIOCGIFADDR`), like the rest of the agent.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

from ringmaster.common.errors import UsageError

_SIOCGIFADDR = 0x8915
#: Names that are this machine whatever it is called.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class NetworkError(UsageError):
    """An interface or address that cannot serve the job; the message names it and what to do."""


def interface_names() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name`."""
    if name not in interface_names():
        raise NetworkError(f"--network-interface {name!r}: this machine has no such interface "
                           f"(it has {', '.join(interface_names())})")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            raise NetworkError(f"--network-interface {name!r} has no IPv4 address; give one that has") from None
    return socket.inet_ntoa(packed[20:24])


def local_addresses() -> set[str]:
    """Every IPv4 address of this machine's interfaces."""
    found = {"127.0.0.1"}
    for name in interface_names():
        try:
            found.add(interface_address(name))
        except NetworkError:
            continue
    return found


def this_machine_names() -> set[str]:
    """Host names and addresses that mean this machine."""
    names = set(LOOPBACK_NAMES) | local_addresses()
    for name in (socket.gethostname(), socket.getfqdn()):
        if name:
            names.add(name.lower())
    return names


def is_this_machine(host: str, names: set[str]) -> bool:
    """True when `host` names this machine: one of `names` or a loopback address."""
    lowered = host.lower()
    if lowered in names:
        return True
    try:
        return ipaddress.ip_address(lowered).is_loopback
    except ValueError:
        return False


def route_address(host: str) -> str:
    """The address of this machine on the route to `host` (what `host` sees us as)."""
    try:
        target = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except (socket.gaierror, IndexError) as exc:
        raise NetworkError(f"cannot resolve host {host!r} to find this machine's address towards it ({exc}); "
                           "give --network-interface or --advertise-address") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))  # no packet is sent: the kernel only picks the route
        except OSError as exc:
            raise NetworkError(f"no route from this machine to host {host} ({target}): {exc.strerror}") from None
        return s.getsockname()[0]
