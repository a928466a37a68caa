"""The open sessions of a job's agents and workers, and what goes into them: what the coordinator
said, each message to the session it is for. A large job's workers that listen to their agent
(event_relay.py) get theirs inside one command per host; the others on their own streams."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ringmaster.common.event_relay import each_worker
from ringmaster.launch.launchers import Launcher
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.control.coordinator import Coordinator
from ringmaster.rendezvous.control.effects import (
    Assign,
    Effect,
    LaunchAgent,
    RunWorkers,
    StopAgent,
    StopLaunchedAgent,
    UpdateHosts,
    WorkerEffect,
)
from ringmaster.rendezvous.server import wire
from ringmaster.rendezvous.server.assignments_out import AssignmentsOut


class SessionOutbox:
    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher  # starts and stops agents as the pool asks
        self.agents: dict[str, asyncio.Queue] = {}  # host -> its agent's session
        self.incarnations: dict[str, str] = {}  # host -> the agent process whose session is open
        self.workers: dict[str, asyncio.Queue] = {}  # worker id -> its session
        # A large job's messages go to these hosts' agents for their workers that listen (event_relay.py).
        self.carriers: set[str] = set()
        self.sharing: set[str] = set()  # ... of which these take one message for many (`HostedEvent.also`)
        self.placing: set[str] = set()  # ... and one assignment for many, each its place (`HostedEvent.places`)
        self.hearing_agent: set[str] = set()
        self.messages = {"stream": 0, "agent": 0}  # messages to workers, by the way they went (metrics)
        self._written: set[asyncio.Queue] = set()  # sessions given messages since `pending` found them written
        self.assignments_out = AssignmentsOut()
        #: Told (generation, seconds) when the last of a generation's assignments was handed to gRPC,
        #: the seconds since the failure seen (or the generation's forming, with no failure): the metrics.
        self.on_assignments_out: Callable[[int, float], None] | None = None

    def agent_carries(self, host: str, carries: bool, shares: bool, places: bool = False) -> None:
        """What `host`'s agent said in its hello: it carries its workers' messages, takes one
        message for several of them (`SharedEvents`), and one assignment for several, each named
        with its own place."""
        for told, hosts in ((carries, self.carriers), (carries and shares, self.sharing),
                            (carries and shares and places, self.placing)):
            if told:
                hosts.add(host)
            else:
                hosts.discard(host)

    def pending(self) -> bool:
        """Whether a session this outbox gave messages still has some to write. Only those are
        looked at: at 4,096 x 8 a look at every session was 37,000 queues, 4% of a growth's
        rendezvous (a session that ended unread keeps it True; the heap's freeze, which asks,
        then waits for its latest time, as it waits for a slow session)."""
        self._written = {queue for queue in self._written if queue.qsize()}
        return bool(self._written)

    def _put(self, queue: asyncio.Queue, message: Any) -> None:
        queue.put_nowait(message)
        self._written.add(queue)

    def deliver(self, coordinator: Coordinator, effects: list[Effect]) -> None:
        to_workers: list[WorkerEffect] = []
        for effect in effects:
            if isinstance(effect, LaunchAgent):
                self.launcher.start(effect.host)
            elif isinstance(effect, StopLaunchedAgent):
                self.launcher.stop(effect.host)
            elif isinstance(effect, (RunWorkers, StopAgent)):
                queue = self.agents.get(effect.host)
                if queue is not None:
                    self._put(queue, wire.agent_command(effect))
            else:
                to_workers.append(effect)
        if to_workers:
            self._to_workers(coordinator, to_workers)

    def _to_workers(self, coordinator: Coordinator, effects: list[WorkerEffect]) -> None:
        """Each worker's messages on its stream, or, for a large job's workers that listen to an
        agent that carries them, inside one command per host (event_relay.py)."""
        commands: dict[str, pb.AgentCommand] = {}
        shared = SharedEvents()
        streamed: list[wire.Planned] = []
        assigning: list[Any] = []  # the messages that carry assignments (to see when the last goes)
        reporting: set[int] = set()  # (ids of) the commands that ask a member to report a host update's commit
        generation = 0
        carry = coordinator.pace.relay and self.carriers
        workers = coordinator.workers
        for planned in wire.plan(effects):
            worker_id, effect, ends = planned
            if getattr(effect, "also", ()):
                self._to_many(effect, commands, shared, streamed, workers if carry else None)
                continue
            if worker_id not in self.workers:
                continue  # (no session: nobody to tell)
            worker = workers.get(worker_id) if carry and worker_id in self.hearing_agent else None
            if worker is not None and worker.host in self.carriers and wire.carriable(effect):
                command = _command_for(commands, worker.host)
                if worker.host in self.sharing:
                    hosted = shared.entry(command, worker_id, effect, ends, worker.host in self.placing)
                    if hosted is None:
                        continue  # (said alike to another of the host's workers: named in that entry)
                else:
                    hosted = command.events.add(worker_id=worker_id)
                wire.fill(hosted.event, effect, ends)
                if isinstance(effect, Assign):
                    generation = max(generation, effect.generation)
                    assigning.append(command)
                elif isinstance(effect, UpdateHosts) and not effect.placed:
                    reporting.add(id(command))
            else:
                streamed.append(planned)
        for (worker_id, message), (_, effect, _) in zip(wire.messages(streamed), streamed):
            self._put(self.workers[worker_id], message)
            if isinstance(effect, Assign):
                generation = max(generation, effect.generation)
                assigning.append(message)
        self.messages["stream"] += len(streamed)
        # The commands that place workers go first: the next ring waits for them and nobody for a
        # retirement (half of a 4,096-host job leaving: 2,048 hosts' retirements were written, and
        # taken in on the hosts, before the first survivor's place). First of all the one that asks
        # a member to report a host update's commit: the next generation forms at its word, and it
        # was heard anywhere among 4,096 hosts' updates (0.25 s later on average at 4,096 x 8).
        placing = {id(message) for message in assigning}
        for host, command in sorted(commands.items(),
                                    key=lambda item: (id(item[1]) not in reporting, id(item[1]) not in placing)):
            self._put(self.agents[host], command)
            self.messages["agent"] += sum(1 + len(hosted.also) for hosted in command.events)
        if assigning:
            job = coordinator.job
            began = job.fault_at if job.fault_at is not None else job.generation_formed_at
            self.assignments_out.queued(generation, began, assigning)

    def _to_many(self, effect: Any, commands: dict[str, pb.AgentCommand], shared: SharedEvents,
                 streamed: list[wire.Planned], workers: Any) -> None:
        """An effect said alike to several workers (`also`: a host update to every member): one
        entry per host for the workers its agent carries and shares (a host's 8 named in it),
        else one message per worker (`workers`: the job's, None when no agent carries any). Per
        host, not per worker: at 4,096 x 8 a host update was 32,768 effects sorted one by one."""
        by_host: dict[str, list[str]] = {}
        for worker_id in (effect.worker_id, *effect.also):
            if worker_id not in self.workers:
                continue  # (no session: nobody to tell)
            worker = workers.get(worker_id) if workers is not None and worker_id in self.hearing_agent else None
            if worker is None or worker.host not in self.carriers:
                streamed.append((worker_id, effect, None))
            elif worker.host in self.sharing:
                by_host.setdefault(worker.host, []).append(worker_id)
            else:  # (an agent of an older release: one entry per worker)
                wire.fill(_command_for(commands, worker.host).events.add(worker_id=worker_id).event, effect)
        for host, named in by_host.items():
            wire.fill(shared.entry_for_all(_command_for(commands, host), named, effect).event, effect)

    def handed_over(self, message: Any, now: float) -> None:
        """A session hands `message` to gRPC to write: the metrics hear when a generation's last
        assignment went. (Once the write is done, the session resumes only when the loop comes
        back to it: at 4,096 x 8, seconds after the workers held their messages.)"""
        if self.assignments_out.watching:
            done = self.assignments_out.handed_over(message, now)
            if done is not None and self.on_assignments_out is not None:
                self.on_assignments_out(*done)

    def reroute(self, queue: asyncio.Queue) -> None:
        """The workers' messages an agent's ended session did not carry go on their own streams
        (the same agent's new session replaced it, and the host still runs them)."""
        while not queue.empty():
            command = queue.get_nowait()
            moved = []
            for hosted in getattr(command, "events", ()):
                for worker_id, event in each_worker(hosted) or ():  # (one object for all where alike: watched)
                    stream = self.workers.get(worker_id)
                    if stream is not None:
                        self._put(stream, event)
                        moved.append(event)
                        self.messages["stream"] += 1
            self.assignments_out.moved(command, moved)


def _command_for(commands: dict[str, pb.AgentCommand], host: str) -> pb.AgentCommand:
    """The command being built for `host`'s agent (a new one the first time)."""
    command = commands.get(host)
    if command is None:
        command = commands[host] = pb.AgentCommand()
    return command


class SharedEvents:
    """The entries of agents' commands that say the same to several workers of a host (a host
    update to all its members, an announcement, a retirement), so that a worker's message alike
    is named in that entry (`HostedEvent.also`) instead of written again: at 4,096 x 8 a host
    update and an announcement were 32,768 messages built each, now 4,096.

    A worker joins an entry only if it has no message after it in that command: each worker's
    messages stay in the order they were said."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[Any, int]] = {}  # (command, what it says) -> (its entry, the entry's index)
        self._last: dict[str, int] = {}  # worker id -> the index of its last entry in its host's command

    def entry_for_all(self, command: pb.AgentCommand, worker_ids: list[str], effect: Any) -> Any:
        """A new entry at the end of `command` for every worker of `worker_ids` (the first named in
        it, the others in `also`), which later words alike may join."""
        index = len(command.events)
        hosted = command.events.add(worker_id=worker_ids[0])
        hosted.also.extend(worker_ids[1:])
        last = self._last
        for worker_id in worker_ids:
            last[worker_id] = index
        said = wire.shared_key(effect)
        if said is not None:
            self._entries[id(command), said] = (hosted, index)
        return hosted

    def entry(self, command: pb.AgentCommand, worker_id: str, effect: Any, ends: Any, placing: bool = False) -> Any:
        """The entry of `command` to write `effect` into for `worker_id` (a new one at its end),
        or None: the worker was named in an entry that says it already. With `placing` (the
        host's agent takes places), an assignment joins one of the same generation and ring,
        with its own place (`HostedEvent.places`): 33,280 assignments at 4,096 x 8 were as many
        entries built, now one per host."""
        said = wire.shared_key(effect) if ends is None else None
        place = None
        if said is None and placing and isinstance(effect, Assign):
            said, place = wire.placement_key(effect, ends), effect.place
        if said is not None:
            key = (id(command), said)
            found = self._entries.get(key)
            if found is not None and self._last.get(worker_id, -1) < found[1]:
                found[0].also.append(worker_id)
                if place is not None:
                    wire.add_place(found[0], place)
                self._last[worker_id] = found[1]  # (what it hears next must come after this entry)
                return None
        index = len(command.events)
        hosted = command.events.add(worker_id=worker_id)
        if place is not None:
            wire.add_place(hosted, place)
        self._last[worker_id] = index
        if said is not None:
            self._entries[id(command), said] = (hosted, index)
        return hosted
