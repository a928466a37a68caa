"""The coordinator's effects as protobuf messages: the only place that knows both."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.control.assignment import RankAssignment
from ringmaster.rendezvous.control.effects import (
    AgentEffect,
    AnnounceHosts,
    Assign,
    EndGeneration,
    EndJob,
    Retire,
    StopAgent,
    UpdateHosts,
    WorkerEffect,
)


def agent_command(effect: AgentEffect) -> pb.AgentCommand:
    if isinstance(effect, StopAgent):
        return pb.AgentCommand(shutdown=True, reason=effect.reason)
    return pb.AgentCommand(workers=[
        pb.WorkerSpec(worker_id=w.worker_id, slot=w.slot, argv=[os.fsencode(a) for a in w.argv],
                      env={name: os.fsencode(value) for name, value in w.env.items()}) for w in effect.workers
    ])


def _shared_fields(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind) if f.name not in ("worker_id", "also"))


#: What decides the message of an effect that is the same for every worker it goes to.
_SHARED: dict[type, tuple[str, ...]] = {kind: _shared_fields(kind)
                                         for kind in (EndGeneration, UpdateHosts, AnnounceHosts, Retire, EndJob)}


#: An effect as it goes to its worker: (worker id, effect, the end of a generation it also says).
Planned = tuple[str, WorkerEffect, EndGeneration | None]


def worker_events(effects: Iterable[WorkerEffect]) -> list[tuple[str, pb.WorkerEvent]]:
    """(worker id, message) for each effect, in order (see `plan` and `messages`)."""
    return messages(plan(effects))


def plan(effects: Iterable[WorkerEffect]) -> list[Planned]:
    """(worker id, effect, the end it also says) for each effect, in order, except that a worker's
    "generation over" followed by its assignment to a newer generation goes inside that
    assignment: after a failure every survivor gets both, and one message each halves what a
    change sends (65,536 messages at 4,096 x 8 workers)."""
    effects = list(effects)
    assigned = {e.worker_id: e.generation for e in effects if isinstance(e, Assign)}
    ended: dict[str, EndGeneration] = {}
    out: list[Planned] = []
    for effect in effects:
        if isinstance(effect, EndGeneration) and assigned.get(effect.worker_id, 0) > effect.generation \
                and effect.worker_id not in ended:
            ended[effect.worker_id] = effect  # said with the assignment, below
            continue
        over = ended.pop(effect.worker_id, None) if isinstance(effect, Assign) else None
        out.append((effect.worker_id, effect, over))
    out += [(worker_id, effect, None) for worker_id, effect in ended.items()]  # (an assignment said first)
    return out


def shared_key(effect: WorkerEffect) -> tuple | None:
    """What decides the message of an effect said alike to many workers (None: one of a worker's
    own, an assignment)."""
    fields = _SHARED.get(type(effect))
    return None if fields is None else (type(effect), *(getattr(effect, name) for name in fields))


def placement_key(effect: Assign, ends: EndGeneration | None) -> tuple:
    """What a host's workers' assignments to one generation share: all but their places (the
    end of the last generation too, said alike to every survivor of a failure)."""
    return (Assign, effect.generation, effect.place.size, effect.store_host, effect.store_port, effect.store_prefix,
            effect.hosts_sequence, None if ends is None else (ends.generation, ends.reason))


def add_place(hosted: pb.HostedEvent, place: RankAssignment) -> None:
    """Name one more worker's place in a host's shared assignment (`HostedEvent.places`)."""
    hosted.places.add(rank=place.rank, local_rank=place.local_rank, local_size=place.local_size,
                      cross_rank=place.cross_rank, cross_size=place.cross_size)


def messages(planned: Iterable[Planned]) -> list[tuple[str, pb.WorkerEvent]]:
    """The message of each planned effect. Effects that say the same to many workers (a host
    update to every member) share one message (messages are never changed once built)."""
    built: dict[tuple, pb.WorkerEvent] = {}
    out = []
    for worker_id, effect, over in planned:
        key = shared_key(effect)
        if key is None or over is not None:
            out.append((worker_id, worker_event(effect, over)))
            continue
        made = built.get(key)
        if made is None:
            made = built[key] = worker_event(effect)
        out.append((worker_id, made))
    return out


def carriable(effect: WorkerEffect) -> bool:
    """Whether a worker's agent may carry this effect's message (event_relay.py): all but the job's
    end, which ends the worker's stream and goes on it. A retirement is carried: half of a
    4,096-host job leaving is 16,384 of them, each a sealed message on its own stream and a stream
    closed by the rendezvous; carried, the worker leaves and closes its session itself (should the
    word be lost, its agent stops it once --stop-grace is over, as it stops any retired worker)."""
    return not isinstance(effect, EndJob)


def worker_event(effect: WorkerEffect, ends: EndGeneration | None = None) -> pb.WorkerEvent:
    """The message of one effect; an assignment says the end of `ends` too."""
    event = pb.WorkerEvent()
    fill(event, effect, ends)
    return event


def fill(event: pb.WorkerEvent, effect: WorkerEffect, ends: EndGeneration | None = None) -> None:
    """Write the message of one effect into `event` (in place: a host's carried messages are
    built inside its agent's command, never copied there); the writer of each kind of effect is
    looked up in a table."""
    writer = _WRITERS.get(type(effect))
    if writer is None:
        raise TypeError(f"not a worker effect: {effect!r}")
    writer(event, effect, ends)


def _assignment(event: pb.WorkerEvent, effect: Assign, ends: EndGeneration | None) -> None:
    a, into = effect.place, event.assignment
    into.SetInParent()
    into.generation, into.rank, into.size = effect.generation, a.rank, a.size
    into.local_rank, into.local_size, into.cross_rank, into.cross_size = (a.local_rank, a.local_size, a.cross_rank,
                                                                          a.cross_size)
    into.store_host, into.store_port, into.store_prefix = effect.store_host, effect.store_port, effect.store_prefix
    into.hosts_sequence = effect.hosts_sequence
    if ends is not None:
        into.ends_generation, into.ends_reason = ends.generation, ends.reason


def _generation_over(event: pb.WorkerEvent, effect: EndGeneration, ends: EndGeneration | None) -> None:
    over = event.generation_over
    over.SetInParent()
    over.generation, over.reason, over.rejoin = effect.generation, effect.reason, effect.rejoin


def _hosts_updated(event: pb.WorkerEvent, effect: UpdateHosts, ends: EndGeneration | None) -> None:
    update = event.hosts_updated
    update.SetInParent()
    update.sequence, update.reason, update.checkpoint = effect.sequence, effect.reason, effect.checkpoint
    update.placed, update.generation = effect.placed, effect.generation


def _hosts_announced(event: pb.WorkerEvent, effect: AnnounceHosts, ends: EndGeneration | None) -> None:
    announced = event.hosts_announced
    announced.SetInParent()
    announced.sequence, announced.reason = effect.sequence, effect.reason


def _retire(event: pb.WorkerEvent, effect: Retire, ends: EndGeneration | None) -> None:
    event.retire.SetInParent()
    event.retire.reason = effect.reason


def _job_ended(event: pb.WorkerEvent, effect: EndJob, ends: EndGeneration | None) -> None:
    event.job_ended.SetInParent()
    event.job_ended.success, event.job_ended.reason = effect.success, effect.reason


#: How each kind of effect to a worker is written into its message.
_WRITERS: dict[type, Callable[[pb.WorkerEvent, Any, EndGeneration | None], None]] = {
    Assign: _assignment, EndGeneration: _generation_over, UpdateHosts: _hosts_updated,
    AnnounceHosts: _hosts_announced, Retire: _retire, EndJob: _job_ended,
}
