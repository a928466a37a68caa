"""Polls host discovery every interval and feeds good host sets to the rendezvous' inputs.

The script runs in a thread (it may block up to its timeout) so the rendezvous keeps answering.
A failing script is reported once per distinct message and the last good host set is kept.
"""

from __future__ import annotations

import asyncio

from ringmaster.discovery import DiscoveryError, HostDiscovery
from ringmaster.rendezvous.server.grpc_service import RendezvousService
from ringmaster.rendezvous.server.metrics import DiscoveryStats


async def poll_discovery(discovery: HostDiscovery, service: RendezvousService, interval_s: float,
                         stats: DiscoveryStats | None = None) -> None:
    """`stats` counts the runs and failed runs (for the metrics)."""
    last_hosts: dict[str, int] | None = None
    last_error: str | None = None
    stats = stats or DiscoveryStats()
    while True:
        try:
            stats.runs += 1
            hosts = await asyncio.to_thread(discovery.find_hosts)
        except DiscoveryError as exc:
            stats.errors += 1
            if str(exc) != last_error:
                last_error = str(exc)
                service.discovery_failed(last_error)
        else:
            last_error = None
            if hosts != last_hosts:
                last_hosts = hosts
                service.hosts_found(hosts)
        await asyncio.sleep(interval_s)
