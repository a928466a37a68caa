"""Which Ray nodes are a job's hosts, and how many workers each takes.

Pure: node records in (what `ray.nodes()` returns, checked field by field, since they cross a
process boundary), hosts out. A host is named after its node (`ray-` and the first 16 hex digits
of the node id), never after its address: the nodes of one machine (`ray.cluster_utils.Cluster`,
or several raylets per host) share an address, and a host name must say which node it is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ringmaster.discovery.parse import MAX_HOSTS, MAX_SLOTS_PER_HOST

#: Every host of a Ray job is named so.
HOST_PREFIX = "ray-"
#: Hex digits of the node id in a host's name (64 bits: unique among any cluster's nodes in practice).
NODE_ID_DIGITS = 16
_NODE_ID = re.compile(r"[0-9a-f]{16,128}")


@dataclass(frozen=True)
class RayNode:
    """What a job needs to know of one Ray node."""

    node_id: str
    alive: bool
    cpus: float
    gpus: float
    draining: bool = False

    @property
    def host(self) -> str:
        return host_name(self.node_id)


def host_name(node_id: str) -> str:
    """The host name of the node `node_id` (hex)."""
    return HOST_PREFIX + node_id[:NODE_ID_DIGITS]


def node_from_record(record: Mapping[str, Any], draining: Iterable[str] = ()) -> RayNode | None:
    """A node from one of `ray.nodes()`'s records, or None for a record that is not one (a wrong
    type anywhere, an id that is not hex): such a record names no host."""
    node_id = record.get("NodeID")
    alive = record.get("Alive")
    resources = record.get("Resources")
    if not isinstance(node_id, str) or not _NODE_ID.fullmatch(node_id) or not isinstance(alive, bool) \
            or not isinstance(resources, Mapping):
        return None
    cpus, gpus = _amount(resources.get("CPU")), _amount(resources.get("GPU"))
    if cpus is None or gpus is None:
        return None
    return RayNode(node_id, alive, cpus, gpus, draining=node_id in set(draining))


def _amount(value: object) -> float | None:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def node_slots(node: RayNode, cpus_per_worker: float, gpus_per_worker: float) -> int:
    """Workers `node` takes: as many as its CPUs (and GPUs, when workers need them) allow, counted
    from its totals as Horovod's Ray discovery did (the agent's actor reserves them)."""
    slots = _whole(node.cpus / cpus_per_worker)
    if gpus_per_worker > 0:
        slots = min(slots, _whole(node.gpus / gpus_per_worker))
    return max(0, slots)


def _whole(ratio: float) -> int:
    """How many whole workers `ratio` allows, at most a host's slots (a tiny share per worker
    makes the ratio overflow to infinity)."""
    return math.floor(min(ratio, MAX_SLOTS_PER_HOST) + 1e-9)


def hosts_of(nodes: Iterable[RayNode], cpus_per_worker: float, gpus_per_worker: float) -> dict[str, int]:
    """host -> slots for every node that is alive, not being drained and takes a worker, in the
    order given, at most a job's number of hosts."""
    hosts: dict[str, int] = {}
    for node in nodes:
        if not node.alive or node.draining:
            continue
        slots = node_slots(node, cpus_per_worker, gpus_per_worker)
        if slots >= 1 and len(hosts) < MAX_HOSTS:
            hosts[node.host] = slots
    return hosts


def check_worker_resources(cpus_per_worker: float, gpus_per_worker: float) -> None:
    """ValueError naming the argument when a worker's resources cannot be met by any node."""
    if isinstance(cpus_per_worker, bool) or not isinstance(cpus_per_worker, (int, float)) \
            or not math.isfinite(cpus_per_worker) or cpus_per_worker <= 0:
        raise ValueError(f"cpus_per_worker must be a positive number, got {cpus_per_worker!r}")
    if isinstance(gpus_per_worker, bool) or not isinstance(gpus_per_worker, (int, float)) \
            or not math.isfinite(gpus_per_worker) or gpus_per_worker < 0:
        raise ValueError(f"gpus_per_worker must be 0 or a positive number, got {gpus_per_worker!r}")
