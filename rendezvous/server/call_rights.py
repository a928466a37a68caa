"""Who may make which rendezvous call: an agent speaks for its own host only, a worker for itself
only (and only on the host it was placed on). Checked on every signed call (`server/auth.py`)."""

from __future__ import annotations

from ringmaster.common.keys import AGENT, WORKER, Identity
from ringmaster.discovery import host_name_problem
from ringmaster.rendezvous.control.coordinator import Coordinator

#: The calls an agent makes (for its own host); the others are a worker's (for itself).
AGENT_CALLS = frozenset({"AgentSession", "AgentHeartbeat", "ReportWorkerExit", "DrainHost", "CarryReady"})


def identity_problem(identity: Identity) -> str | None:
    """Why a caller's identity cannot be a part of this job (checked before its key is derived)."""
    problem = host_name_problem(identity.host)
    if problem or identity.role == AGENT:
        return problem
    host, _, number = identity.worker.rpartition("/")
    if host != identity.host or not (number.isascii() and number.isdigit() and len(number) < 12):
        return f"{identity.worker[:100]!r} is not a worker id of host {identity.host}"
    return None


def call_refused(coordinator: Coordinator, method: str, identity: Identity, request: object) -> str | None:
    """Why `identity` may not make this call, or None."""
    if method in AGENT_CALLS:
        if identity.role != AGENT:
            return f"{method} is an agent's call"
        if request.host != identity.host:  # type: ignore[attr-defined]
            return f"it speaks for host {request.host[:100]!r}"  # type: ignore[attr-defined]
        return None
    if identity.role != WORKER:
        return f"{method} is a worker's call"
    if request.worker_id != identity.worker:  # type: ignore[attr-defined]
        return f"it speaks for worker {request.worker_id[:100]!r}"  # type: ignore[attr-defined]
    if method == "WorkerSession" and request.host != identity.host:  # type: ignore[attr-defined]
        return f"it says it runs on {request.host[:100]!r}"  # type: ignore[attr-defined]
    worker = coordinator.workers.get(identity.worker)
    if worker is not None and worker.host != identity.host:
        return f"worker {identity.worker} was placed on {worker.host}"
    return None
