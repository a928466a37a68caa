"""Parse host lists: discovery script output (``host:slots`` per line), the ``-H`` flag and
horovodrun's ``--hostfile`` (``host slots=N`` per line)."""

from __future__ import annotations

import re

from ringmaster.discovery.errors import DiscoveryError
from ringmaster.settings import MAX_SLOTS_PER_HOST

# Host names as DNS allows them (RFC 1123 labels; `_` too, as real clusters use it), which
# covers IPv4 literals; no spaces, no colons (IPv6 literals cannot be told from host:slots).
# Matched whole (`fullmatch`): `$` alone would let a trailing newline through.
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?")
#: A slot count as people write it: ASCII digits only (Python's int() also takes '1_0' and '１').
_SLOTS = re.compile(r"-?[0-9]{1,12}")
#: Longest host name DNS allows.
MAX_HOST_NAME = 253
#: Most hosts one discovery output or -H may list.
MAX_HOSTS = 8192


def host_name_problem(host: str) -> str | None:
    """Why `host` is not a usable host name, or None. Used wherever a name enters: discovery
    output, -H, an agent's hello."""
    if not host:
        return "the host name is empty"
    if len(host) > MAX_HOST_NAME:
        return f"a host name of {len(host)} characters is over DNS's limit of {MAX_HOST_NAME}"
    if ":" in host:
        return f"{host[:80]!r} looks like an IPv6 address; give the host's name instead"
    if not all(_LABEL.fullmatch(label) for label in host.split(".")):
        return (f"{host[:80]!r} is not a valid host name (letters, digits, '-', '_' in dot-separated labels "
                "of at most 63 characters)")
    return None


def _parse_entry(entry: str, default_slots: int | None, where: str) -> tuple[str, int]:
    if ":" in entry:
        host, _, slots_text = entry.rpartition(":")
        host = host.strip()
        slots_text = slots_text.strip()
        if _SLOTS.fullmatch(slots_text):
            slots = int(slots_text)
        elif slots_text.isascii() and slots_text.isdigit():  # a long count of ASCII digits
            slots = MAX_SLOTS_PER_HOST + 1
        else:
            raise DiscoveryError(
                f"{where}: {entry[:100]!r}: slots {slots_text[:20]!r} is not an integer; write 'host:slots', e.g. "
                "'node1:4'"
            )
    else:
        host = entry.strip()
        if default_slots is None:
            raise DiscoveryError(
                f"{where}: {entry!r} gives no slot count; write 'host:slots' or pass --slots-per-host"
            )
        slots = default_slots
    shown = entry if len(entry) <= 100 else entry[:100] + "..."
    problem = host_name_problem(host)
    if problem:
        raise DiscoveryError(f"{where}: {shown!r}: {problem}")
    if slots <= 0:
        raise DiscoveryError(f"{where}: {shown!r}: slots must be a positive integer, got {slots}")
    if slots > MAX_SLOTS_PER_HOST:
        raise DiscoveryError(f"{where}: {shown!r}: slots must be at most {MAX_SLOTS_PER_HOST} per host")
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
            raise DiscoveryError(f"{where}: {raw.strip()[:100]!r} has spaces; write one 'host:slots' per line")
        host, slots = _parse_entry(line, default_slots, where)
        if host in hosts:
            raise DiscoveryError(f"{where}: host {host!r} is listed twice")
        hosts[host] = slots
        if len(hosts) > MAX_HOSTS:
            raise DiscoveryError(f"{where}: more than {MAX_HOSTS} hosts listed; a job takes at most {MAX_HOSTS}")
    return hosts


def parse_hosts_flag(value: str, default_slots: int | None = 1) -> dict[str, int]:
    """Parse ``-H a:2,b:4`` (a host without a count gets `default_slots`)."""
    hosts: dict[str, int] = {}
    for position, entry in enumerate(filter(None, (e.strip() for e in value.split(","))), start=1):
        host, slots = _parse_entry(entry, default_slots, f"--hosts entry {position}")
        if host in hosts:
            raise DiscoveryError(f"--hosts entry {position}: host {host!r} is listed twice")
        hosts[host] = slots
        if len(hosts) > MAX_HOSTS:
            raise DiscoveryError(f"--hosts lists more than {MAX_HOSTS} hosts")
    if not hosts:
        raise DiscoveryError(f"--hosts {value!r} names no host; write e.g. -H node1:2,node2:2")
    return hosts


#: Largest --hostfile read (a host per line: far above MAX_HOSTS lines of long names).
MAX_HOSTFILE_BYTES = 4 << 20
_SLOTS_CLAUSE = re.compile(r"slots\s*=\s*(\S+)")


def parse_hostfile(text: str, default_slots: int | None = 1, source: str = "--hostfile") -> dict[str, int]:
    """Parse horovodrun's (and MPI's) host file: one ``host slots=N`` per line; ``host:N`` and a
    bare ``host`` (`default_slots`) are taken too. Blank lines and ``#`` comments are skipped;
    errors name the line."""
    entries: list[str] = []  # a line per line of the file (blank where none), so errors name the file's line
    listed = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            entries.append("\n")
            continue
        host, *more = line.split(None, 1)
        rest = more[0].strip() if more else ""
        if rest:
            clause = _SLOTS_CLAUSE.fullmatch(rest)
            if clause is None or ":" in host:
                raise DiscoveryError(f"{source} line {number}: {raw.strip()[:100]!r}: write 'host slots=N' "
                                     "(as horovodrun reads it) or 'host:N'")
            host = f"{host}:{clause.group(1)}"
        entries.append(f"{host}\n")
        listed += 1
        if listed > MAX_HOSTS:
            raise DiscoveryError(f"{source} line {number}: more than {MAX_HOSTS} hosts listed; a job takes at most "
                                 f"{MAX_HOSTS}")
    hosts = parse_host_lines("".join(entries), default_slots, source) if entries else {}
    if not hosts:
        raise DiscoveryError(f"{source} names no host; write one 'host slots=N' per line")
    return hosts
