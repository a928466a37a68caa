"""Messages said alike to several workers of a host go once, naming them all (`SharedEvents`,
`HostedEvent.also`): whatever the mix, each worker still hears its own messages, in the order
they were said, and what the agent hands out is what one entry per worker would have been."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from hypothesis import example, given
from hypothesis import strategies as st

from ringmaster.common.event_relay import each_worker
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.control.assignment import RankAssignment
from ringmaster.rendezvous.control.effects import (
    AnnounceHosts,
    Assign,
    EndGeneration,
    Retire,
    UpdateHosts,
    one_per_worker,
)
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
        each = each_worker(hosted)
        assert each is not None, hosted
        for worker_id, event in each:
            heard.setdefault(worker_id, []).append(event.SerializeToString())
    return heard


@given(st.lists(st.tuples(st.sampled_from(WORKERS), st.integers(0, 4)), max_size=30), st.booleans())
def test_each_worker_hears_what_it_would_have_heard_alone_in_order(said, placing) -> None:
    """Assignments among them, which with `placing` join one entry, each with its own place."""
    effects = [_effect(worker_id, kind) for worker_id, kind in said]
    alone = pb.AgentCommand()
    for effect in effects:
        fill(alone.events.add(worker_id=effect.worker_id).event, effect)
    shared = pb.AgentCommand()
    entries = SharedEvents()
    for effect in effects:
        hosted = entries.entry(shared, effect.worker_id, effect, None, placing)
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


# ---------------------------------------------------------------- one effect naming many workers
#: Workers on a host whose agent carries and shares (hS), one whose agent carries one entry per
#: worker (an older release, hC), one whose workers hear their own streams (hN), and one worker
#: with no session at all (hS/9: nobody to tell).
HOSTED = {"hS/1": "hS", "hS/2": "hS", "hS/3": "hS", "hC/1": "hC", "hC/2": "hC", "hN/1": "hN", "hS/9": "hS"}


def _outbox(placing: bool = False) -> SessionOutbox:
    """`placing`: hS's agent takes one assignment for several workers, each with its place."""
    outbox = SessionOutbox(launcher=None)  # type: ignore[arg-type]  # (no agents are started here)
    for host in ("hS", "hC", "hN"):
        outbox.agents[host] = asyncio.Queue()
        outbox.agent_carries(host, carries=host != "hN", shares=host == "hS", places=placing)
    for worker_id in HOSTED:
        if worker_id != "hS/9":
            outbox.workers[worker_id] = asyncio.Queue()
            outbox.hearing_agent.add(worker_id)
    return outbox


def _coordinator() -> SimpleNamespace:
    """What the outbox reads of the coordinator: whether agents carry, each worker's host, and
    when the generation began (the figures of its assignments)."""
    workers = {worker_id: SimpleNamespace(host=host) for worker_id, host in HOSTED.items()}
    return SimpleNamespace(pace=SimpleNamespace(relay=True), workers=workers,
                           job=SimpleNamespace(fault_at=None, generation_formed_at=0.0))


def _heard(outbox: SessionOutbox) -> dict[str, list[bytes]]:
    """What each worker heard, through its agent's commands or on its own stream, in order."""
    heard: dict[str, list[bytes]] = {}
    for queue in outbox.agents.values():
        while not queue.empty():
            for worker_id, events in _per_worker(queue.get_nowait()).items():
                heard.setdefault(worker_id, []).extend(events)
    for worker_id, queue in outbox.workers.items():
        while not queue.empty():
            heard.setdefault(worker_id, []).append(queue.get_nowait().SerializeToString())
    return heard


def _alike(kind: int, named: list[str]):
    first, also = named[0], tuple(named[1:])
    if kind == 0:
        return UpdateHosts(first, 4, "hosts changed", placed=True, generation=2, also=also)
    if kind == 1:
        return UpdateHosts(first, 5, "hosts changed again", also=also)
    if kind == 3:
        return Retire(first, "host hS left the job", also=also)
    return AnnounceHosts(first, 3, "newcomers warming up", also=also)


@given(st.lists(st.one_of(
    st.tuples(st.just("alike"), st.integers(0, 3), st.lists(st.sampled_from(sorted(HOSTED)), min_size=1, unique=True)),
    st.tuples(st.just("own"), st.integers(0, 5), st.sampled_from(["hS/1", "hS/2", "hS/3"]))), max_size=12),
    st.booleans())
@example([("own", 5, "hS/1"), ("own", 4, "hS/1"), ("own", 4, "hS/2")], True)  # (one survivor's place says an end)
def test_one_effect_naming_many_workers_says_to_each_what_one_effect_each_would(said, placing) -> None:
    effects = [_alike(kind, who) if way == "alike" else _own(who, kind) for way, kind, who in said]
    grouped, alone = _outbox(placing), _outbox()
    grouped._to_workers(_coordinator(), effects)  # type: ignore[arg-type]
    alone._to_workers(_coordinator(), [one for e in effects for one in one_per_worker(e)])  # type: ignore[arg-type]
    assert _heard(grouped) == _heard(alone)


def _own(worker_id: str, kind: int):
    """`_effect` for a worker of host hS; kind 5, the end of its generation (said inside a later
    assignment to it, as to a failure's survivors)."""
    if kind == 5:
        return EndGeneration(worker_id, 2, "a peer died", rejoin=True)
    effect = _effect("hA/" + worker_id.split("/")[1], kind)
    if isinstance(effect, Assign):
        return Assign(RankAssignment(worker_id, "hS", *effect.place[2:]), 3, "h", 1, "g3", 4)
    return replace(effect, worker_id=worker_id)


def test_a_host_update_to_every_member_is_one_entry_per_sharing_host() -> None:
    outbox = _outbox()
    outbox._to_workers(_coordinator(), [_alike(0, sorted(HOSTED))])  # type: ignore[arg-type]
    shared = outbox.agents["hS"].get_nowait()
    assert [(e.worker_id, list(e.also)) for e in shared.events] == [("hS/1", ["hS/2", "hS/3"])]  # (hS/9: no session)
    assert [e.worker_id for e in outbox.agents["hC"].get_nowait().events] == ["hC/1", "hC/2"]
    assert outbox.workers["hN/1"].get_nowait().hosts_updated.sequence == 4
    assert outbox.messages == {"stream": 1, "agent": 5}


class _Told:
    """An agent's session queue that notes in `order` which host was handed its command when."""

    def __init__(self, host: str, order: list[str]) -> None:
        self.host, self.order = host, order

    def put_nowait(self, command: pb.AgentCommand) -> None:
        self.order.append(self.host)


def _noting_order(outbox: SessionOutbox) -> list[str]:
    """The hosts `outbox` hands commands to, in the order it hands them (its agents' queues replaced)."""
    order: list[str] = []
    outbox.agents = {host: _Told(host, order) for host in outbox.agents}  # type: ignore[misc]
    return order


def test_the_commands_that_place_workers_go_out_before_those_that_retire_them() -> None:
    outbox = _outbox()
    order = _noting_order(outbox)
    retire = [Retire(worker_id, "host hS left the job") for worker_id in ("hS/1", "hS/2", "hS/3")]
    place = Assign(RankAssignment("hC/1", "hC", 0, 1, 0, 1, 0, 1), 3, "h", 1, "g3", 4)
    outbox._to_workers(_coordinator(), [*retire, place])  # type: ignore[arg-type]
    assert order == ["hC", "hS"]  # (said in the other order)


def test_the_command_that_asks_for_a_host_updates_report_goes_out_first() -> None:
    """The next generation forms at the word of the one member asked to report the update's
    commit (`UpdateHosts.placed` False): its host's command goes before every other host's."""
    outbox = _outbox()
    order = _noting_order(outbox)
    others = UpdateHosts("hS/1", 4, "hosts changed", placed=True, generation=2, also=("hS/2", "hS/3"))
    reporter = UpdateHosts("hC/1", 4, "hosts changed", placed=False, generation=2)
    outbox._to_workers(_coordinator(), [others, reporter])  # type: ignore[arg-type]
    assert order == ["hC", "hS"]  # (said in the other order)


def test_a_hosts_assignments_to_one_generation_are_one_entry_with_each_place() -> None:
    """33,280 assignments at 4,096 x 8 were as many entries; to an agent that takes places, one
    per host. To one that does not (an older release), one per worker as before."""
    for placing, entries in ((True, [("hS/1", ["hS/2", "hS/3"])]), (False, [("hS/1", []), ("hS/2", []), ("hS/3", [])])):
        outbox = _outbox(placing)
        outbox._to_workers(_coordinator(), [_own(worker_id, 4) for worker_id in ("hS/1", "hS/2", "hS/3")])  # type: ignore[arg-type]
        command = outbox.agents["hS"].get_nowait()
        assert [(e.worker_id, list(e.also)) for e in command.events] == entries
        ranks = [event.assignment.rank for hosted in command.events for _, event in each_worker(hosted) or ()]
        assert ranks == [0, 1, 2]


class _Untouched(asyncio.Queue):
    """A session never given a message: `pending` must not look at it (a look at every one of
    37,000 sessions was 4% of a 4,096 x 8 growth's rendezvous)."""

    def qsize(self) -> int:
        raise AssertionError("pending looked at a session it gave nothing")


def test_pending_looks_only_at_the_sessions_it_gave_messages_until_they_are_written() -> None:
    outbox = _outbox(placing=True)
    outbox.workers.update({f"hX/{n}": _Untouched() for n in range(3)})
    assert not outbox.pending()
    outbox._to_workers(_coordinator(), [_own("hS/1", 4), _alike(2, ["hN/1"])])  # type: ignore[arg-type]
    assert outbox.pending()
    outbox.agents["hS"].get_nowait()
    assert outbox.pending()  # (hN/1's own stream still holds its announcement)
    outbox.workers["hN/1"].get_nowait()
    assert not outbox.pending()
