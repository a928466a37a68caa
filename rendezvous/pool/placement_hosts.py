"""A job's hosts as the pool places it: the `HostDiscovery` each job of a pool reads. The pool
sets the placement; the job's rendezvous sees it as discovery's host set and grows or shrinks at
its next commit, as it does for any discovery change."""

from __future__ import annotations

from typing import Mapping


class PlacementHosts:
    def __init__(self, placement: Mapping[str, int]) -> None:
        self._hosts = dict(placement)

    def set(self, placement: Mapping[str, int]) -> None:
        self._hosts = dict(placement)

    def find_hosts(self) -> dict[str, int]:
        return dict(self._hosts)

    def describe(self) -> str:
        return "the pool's placement " + (",".join(f"{h}:{n}" for h, n in self._hosts.items()) or "(none)")
