"""Messages said alike to several workers of a host go once, naming them all (`SharedEvents`,
`HostedEvent.also`): whatever the mix, each worker still hears its own messages, in the order
they were said, and what the agent hands out is what one entry per worker would have been."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.control.assignment import RankAssignment
from ringmaster.rendezvous.control.effects import AnnounceHosts, Assign, Retire, UpdateHosts
from ringmaster.rendezvous.server.session_outbox import SessionOutbox, SharedEvents
from ringmaster.rendezvous.server.wire import fill

WORKERS = ["hA/1", "hA/2", "hA/3"]


def _effect(worker_id: str, kind: int):
    """A few effects alike for every worker (the host update, told placed or not; an
    announcement; a retirement) and one of its own (an assignment)."""
    if kind == 0:
        return UpdateHosts(worker_id, 4, "hosts changed", placed=True, generation=2)
    if kind == 1:
        return UpdateHosts(worker_id, 4, "hosts changed", placed=False, generation=2)
    if kind == 2:
        return AnnounceHosts(worker_id, 3, "newcomers warming up")
    if kind == 3:
        return Retire(worker_id, "host hA left the job")
    rank = WORKERS.index(worker_id)
    return Assign(RankAssignment(worker_id, "hA", rank, 3, rank, 3, 0, 1), 3, "h", 1, "g3", 4)


def _per_worker(command: pb.AgentCommand) -> dict[str, list[bytes]]:
    """What the agent hands each worker (as `EventForwarder.forward` does)."""
    heard: dict[str, list[bytes]] = {}
    for hosted in command.events:
        for worker_id in (hosted.worker_id, *hosted.also):
            heard.setdefault(worker_id, []).append(hosted.event.SerializeToString())
    return heard


@given(st.lists(st.tuples(st.sampled_from(WORKERS), st.integers(0, 4)), max_size=30))
def test_each_worker_hears_what_it_would_have_heard_alone_in_order(said) -> None:
    effects = [_effect(worker_id, kind) for worker_id, kind in said]
    alone = pb.AgentCommand()
    for effect in effects:
        fill(alone.events.add(worker_id=effect.worker_id).event, effect)
    shared = pb.AgentCommand()
    entries = SharedEvents()
    for effect in effects:
        hosted = entries.entry(shared, effect.worker_id, effect, None)
        if hosted is not None:
            fill(hosted.event, effect)
    assert _per_worker(shared) == _per_worker(alone)
    assert len(shared.events) <= len(alone.events)


def test_a_host_update_to_a_whole_host_is_one_entry() -> None:
    command = pb.AgentCommand()
    entries = SharedEvents()
    effects = [_effect("hA/1", 1), _effect("hA/2", 0), _effect("hA/3", 0), _effect("hA/2", 4)]
    for effect in effects:
        hosted = entries.entry(command, effect.worker_id, effect, None)
        if hosted is not None:
            fill(hosted.event, effect)
    # the reporter's own (it asks), one for the others, and an assignment of its own
    assert [(e.worker_id, list(e.also)) for e in command.events] == [("hA/1", []), ("hA/2", ["hA/3"]), ("hA/2", [])]


def test_messages_named_in_an_ended_agent_session_go_on_each_workers_stream() -> None:
    outbox = SessionOutbox(launcher=None)  # type: ignore[arg-type]  # (no agents are started here)
    streams: dict[str, asyncio.Queue] = {worker_id: asyncio.Queue() for worker_id in ("hA/1", "hA/3")}  # (not hA/2)
    outbox.workers.update(streams)
    update = pb.WorkerEvent(hosts_updated=pb.HostsUpdated(sequence=4, placed=True))
    agent: asyncio.Queue = asyncio.Queue()
    agent.put_nowait(pb.AgentCommand(events=[pb.HostedEvent(worker_id="hA/1", event=update, also=["hA/2", "hA/3"])]))
    outbox.reroute(agent)
    assert [q.get_nowait() for q in streams.values()] == [update, update]
    assert outbox.messages["stream"] == 2
