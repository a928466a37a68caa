"""Parse host lists: discovery script output (``host:slots`` per line) and the ``-H`` flag."""

from __future__ import annotations

import re

from discovery.errors import DiscoveryError

# Host names as DNS allows them, plus IPv4 addresses; no spaces, no colons.
_HOST = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.\-]*[A-Za-z0-9_])?$")


def _parse_entry(entry: str, default_slots: int | None, where: str) -> tuple[str, int]:
    if ":" in entry:
        host, _, slots_text = entry.rpartition(":")
        host = host.strip()
        slots_text = slots_text.strip()
        try:
            slots = int(slots_text)
        except ValueError:
            raise DiscoveryError(
                f"{where}: {entry!r}: slots {slots_text!r} is not an integer; write 'host:slots', e.g. 'node1:4'"
            ) from None
    else:
        host = entry.strip()
        if default_slots is None:
            raise DiscoveryError(
                f"{where}: {entry!r} gives no slot count; write 'host:slots' or pass --slots-per-host"
            )
        slots = default_slots
    if not _HOST.match(host):
        raise DiscoveryError(f"{where}: {entry!r}: {host!r} is not a valid host name")
    if slots <= 0:
        raise DiscoveryError(f"{where}: {entry!r}: slots must be a positive integer, got {slots}")
    return host, slots


def parse_host_lines(text: str, default_slots: int | None = None, source: str = "discovery") -> dict[str, int]:
    """Parse discovery output: one ``host`` or ``host:slots`` per line, as Horovod reads it.

    Blank lines and ``#`` comments are skipped. A host listed twice is an error (which count
    would be meant?). Errors name the line number and its text.
    """
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {number}"
        if any(c.isspace() for c in line):
            raise DiscoveryError(f"{where}: {raw.strip()!r} has spaces; write one 'host:slots' per line")
        host, slots = _parse_entry(line, default_slots, where)
        if host in hosts:
            raise DiscoveryError(f"{where}: host {host!r} is listed twice")
        hosts[host] = slots
    return hosts


def parse_hosts_flag(value: str, default_slots: int | None = 1) -> dict[str, int]:
    """Parse ``-H a:2,b:4`` (a host without a count gets `default_slots`)."""
    hosts: dict[str, int] = {}
    for position, entry in enumerate(filter(None, (e.strip() for e in value.split(","))), start=1):
        host, slots = _parse_entry(entry, default_slots, f"--hosts entry {position}")
        if host in hosts:
            raise DiscoveryError(f"--hosts entry {position}: host {host!r} is listed twice")
        hosts[host] = slots
    if not hosts:
        raise DiscoveryError(f"--hosts {value!r} names no host; write e.g. -H node1:2,node2:2")
    return hosts
