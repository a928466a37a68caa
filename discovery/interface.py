"""The one interface every discovery source implements."""

from __future__ import annotations

from typing import Mapping, Protocol

#: host name -> number of worker slots on it (always >= 1), in the order discovery gave them.
Hosts = Mapping[str, int]


class HostDiscovery(Protocol):
    """Where a job's hosts come from.

    `find_hosts` returns the current host set or raises `DiscoveryError`; it may block (a
    script runs) but never longer than the source's own timeout.
    """

    def find_hosts(self) -> dict[str, int]: ...

    def describe(self) -> str:
        """A short human description for logs, e.g. ``script ./hosts.sh``."""
        ...
