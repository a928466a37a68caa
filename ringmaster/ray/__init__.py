"""Ringmaster on Ray: `from ringmaster.ray import ElasticRayExecutor` (the `ray` extra:
`pip install 'ringmaster[ray]'`).

The successor of `horovod.ray`'s elastic executor: the job's hosts are the Ray cluster's alive
nodes, each node's agent is an actor pinned to it, and the workers are that agent's processes,
so a node that joins, dies or is drained costs what it costs any Ringmaster job.
"""

from __future__ import annotations

try:
    import ray as _ray  # noqa: F401
except ImportError:  # pragma: no cover - depends on what is installed
    raise ImportError("ringmaster.ray needs Ray: pip install 'ringmaster[ray]' (or pip install ray)") from None

from ringmaster.ray.detached import DetachedRayJob
from ringmaster.ray.executor import ElasticRayExecutor, RayJobFailed

__all__ = ["DetachedRayJob", "ElasticRayExecutor", "RayJobFailed"]
