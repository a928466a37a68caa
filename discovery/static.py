"""A fixed host list (``-H`` or the embedded ``localhost:np`` default)."""

from __future__ import annotations

from typing import Mapping


class StaticDiscovery:
    """Always returns the same hosts."""

    def __init__(self, hosts: Mapping[str, int]) -> None:
        self._hosts = dict(hosts)

    def find_hosts(self) -> dict[str, int]:
        return dict(self._hosts)

    def describe(self) -> str:
        return "hosts " + ",".join(f"{h}:{s}" for h, s in self._hosts.items()) if self._hosts else "no listed hosts"
