"""The coordinator's effects as protobuf messages: the only place that knows both."""

from __future__ import annotations

import dataclasses
from typing import Iterable

from ringmaster.proto import ringmaster_pb2 as pb

from ringmaster.rendezvous.control.effects import (
    AgentEffect, Assign, EndGeneration, EndJob, Retire, StopAgent, UpdateHosts, WorkerEffect,
)


def agent_command(effect: AgentEffect) -> pb.AgentCommand:
    if isinstance(effect, StopAgent):
        return pb.AgentCommand(shutdown=True, reason=effect.reason)
    return pb.AgentCommand(workers=[
        pb.WorkerSpec(worker_id=w.worker_id, slot=w.slot, argv=list(w.argv), env=dict(w.env)) for w in effect.workers
    ])


def _shared_fields(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind) if f.name != "worker_id")


#: What decides the message of an effect that is the same for every worker it goes to.
_SHARED: dict[type, tuple[str, ...]] = {kind: _shared_fields(kind) for kind in (EndGeneration, UpdateHosts, Retire, EndJob)}


def worker_events(effects: Iterable[WorkerEffect]) -> list[tuple[str, pb.WorkerEvent]]:
    """(worker id, message) for each effect, in order, except that a worker's "generation over"
    followed by its assignment to a newer generation goes inside that assignment: after a
    failure every survivor gets both, and one message each halves what a change sends (65,536
    messages at 4,096 x 8 workers). Effects that say the same to many workers (a host update to
    every member) share one message (messages are never changed once built)."""
    effects = list(effects)
    built: dict[tuple, pb.WorkerEvent] = {}

    def message(effect: WorkerEffect, over: EndGeneration | None = None) -> pb.WorkerEvent:
        fields = _SHARED.get(type(effect))
        if fields is None or over is not None:
            return worker_event(effect, over)
        key = (type(effect), *(getattr(effect, name) for name in fields))
        made = built.get(key)
        if made is None:
            made = built[key] = worker_event(effect)
        return made

    assigned = {e.worker_id: e.generation for e in effects if isinstance(e, Assign)}
    ended: dict[str, EndGeneration] = {}
    out: list[tuple[str, pb.WorkerEvent]] = []
    for effect in effects:
        if isinstance(effect, EndGeneration) and assigned.get(effect.worker_id, 0) > effect.generation \
                and effect.worker_id not in ended:
            ended[effect.worker_id] = effect  # said with the assignment, below
            continue
        over = ended.pop(effect.worker_id, None) if isinstance(effect, Assign) else None
        out.append((effect.worker_id, message(effect, over)))
    out += [(worker_id, message(effect)) for worker_id, effect in ended.items()]  # (an assignment said first)
    return out


def worker_event(effect: WorkerEffect, ends: EndGeneration | None = None) -> pb.WorkerEvent:
    """The message of one effect; an assignment says the end of `ends` too."""
    if isinstance(effect, Assign):
        a = effect.place
        return pb.WorkerEvent(assignment=pb.Assignment(
            generation=effect.generation, rank=a.rank, size=a.size, local_rank=a.local_rank,
            local_size=a.local_size, cross_rank=a.cross_rank, cross_size=a.cross_size,
            store_host=effect.store_host, store_port=effect.store_port, store_prefix=effect.store_prefix,
            hosts_sequence=effect.hosts_sequence,
            ends_generation=ends.generation if ends is not None else 0, ends_reason=ends.reason if ends is not None else "",
        ))
    if isinstance(effect, EndGeneration):
        return pb.WorkerEvent(generation_over=pb.GenerationOver(generation=effect.generation, reason=effect.reason))
    if isinstance(effect, UpdateHosts):
        return pb.WorkerEvent(hosts_updated=pb.HostsUpdated(sequence=effect.sequence, reason=effect.reason,
                                                                  checkpoint=effect.checkpoint))
    if isinstance(effect, Retire):
        return pb.WorkerEvent(retire=pb.Retire(reason=effect.reason))
    if isinstance(effect, EndJob):
        return pb.WorkerEvent(job_ended=pb.JobEnded(success=effect.success, reason=effect.reason))
    raise TypeError(f"not a worker effect: {effect!r}")
