"""The `Ready`s of a host's workers as its agent carries them (`CarryReady`; the agent's side is
worker/agent/ready_relay.py): one call per host where a large job's membership change would
make one per worker."""

from __future__ import annotations

from typing import Iterable

from ringmaster.common.errors import Refused
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.control.coordinator import Coordinator


def take_carried(coordinator: Coordinator, host: str, readies: Iterable[pb.ReadyRequest],
                 now: float) -> tuple[pb.CarriedReadyAnswer, int]:
    """Take each `Ready` as the worker's own call is, for workers placed on `host` only (an agent
    speaks for its own host's workers); the answer names the refused. Also how many were taken."""
    answer, taken = pb.CarriedReadyAnswer(), 0
    for ready in readies:
        worker = coordinator.workers.get(ready.worker_id)
        try:
            if worker is None or worker.host != host:
                raise Refused(f"worker {ready.worker_id[:100]!r} does not run on host {host}")
            coordinator.worker_ready(ready.worker_id, ready.after_generation, ready.failure, ready.elastic, now,
                                     awaits_hosts=ready.awaits_hosts)
        except Refused as refusal:
            answer.refused.add(worker_id=ready.worker_id[:200], reason=str(refusal)[:2000])
            continue
        taken += 1
    return answer, taken
