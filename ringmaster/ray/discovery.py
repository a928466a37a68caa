"""The hosts of a job on Ray: the cluster's alive nodes with the resources a worker needs.

Polled like any discovery source (`--discovery-interval`), so a node the autoscaler adds joins the
job at its next commit and a node that dies leaves it. A node being drained (Ray's drain API:
the autoscaler's scale-down, a preemption) is left out, and its agent is told to drain its host
(`on_draining`), so its workers leave at their next commit and no work is lost.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from ringmaster.common import logs
from ringmaster.discovery import DiscoveryError
from ringmaster.ray.nodes import RayNode, hosts_of, node_from_record

log = logging.getLogger(logs.RENDEZVOUS)


class RayNodeDiscovery:
    """`find_hosts` reads the cluster's nodes (one call to Ray's control store per poll)."""

    def __init__(self, cpus_per_worker: float, gpus_per_worker: float,
                 on_draining: Callable[[str], None] = lambda host: None) -> None:
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self._on_draining = on_draining
        self._lock = threading.Lock()
        self._node_ids: dict[str, str] = {}  # host -> node id, of every alive node seen last
        self._draining_told: set[str] = set()
        self._drain_state_unknown = False

    def describe(self) -> str:
        return (
            f"the Ray cluster's alive nodes ({self.cpus_per_worker:g} CPU{'' if self.cpus_per_worker == 1 else 's'}"
            f"{f', {self.gpus_per_worker:g} GPU' if self.gpus_per_worker else ''} per worker)"
        )

    def node_id(self, host: str) -> str | None:
        """The node id of `host`, as of the last poll (None: no alive node is that host)."""
        with self._lock:
            return self._node_ids.get(host)

    def find_hosts(self) -> dict[str, int]:
        import ray

        if not ray.is_initialized():
            raise DiscoveryError("this process is not connected to a Ray cluster: call ray.init(...) before "
                                 "starting the executor")
        try:
            records = ray.nodes()
        except Exception as exc:  # Ray's control store unreachable
            raise DiscoveryError(f"cannot list the Ray cluster's nodes: {exc}") from None
        draining = self._draining_node_ids()
        nodes = [node for node in (node_from_record(r, draining) for r in records if isinstance(r, dict))
                 if node is not None]
        self._remember(nodes)
        return hosts_of(nodes, self.cpus_per_worker, self.gpus_per_worker)

    def _remember(self, nodes: list[RayNode]) -> None:
        with self._lock:
            self._node_ids = {n.host: n.node_id for n in nodes if n.alive}
        for node in nodes:
            if node.alive and node.draining and node.host not in self._draining_told:
                self._draining_told.add(node.host)
                self._on_draining(node.host)

    def _draining_node_ids(self) -> set[str]:
        """Node ids Ray is draining. Ray says so only through its control store's node table
        (`state_snapshot.state == DRAINING`), not through `ray.nodes()`; where that is not
        available (another Ray version), no node is taken for drained, said once."""
        try:
            import ray

            worker: Any = ray._private.worker.global_worker
            client = worker.gcs_client
            out = set()
            for node_id, info in client.get_all_node_info().items():
                snapshot = info.state_snapshot
                state = snapshot.DESCRIPTOR.fields_by_name["state"].enum_type.values_by_number.get(snapshot.state)
                if state is not None and state.name == "DRAINING":
                    out.add(node_id.hex())
            return out
        except Exception as exc:  # a private interface: any change to it must not stop discovery
            if not self._drain_state_unknown:
                self._drain_state_unknown = True
                log.warning("cannot read which Ray nodes are being drained (%s); drained nodes leave when they die",
                            str(exc)[:200])
            return set()
