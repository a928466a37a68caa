"""What an agent's session had not yet carried when it ended goes to the workers' own streams
(rendezvous/server/session_outbox.py, `SessionOutbox.reroute`). A session replaced with messages still queued
cannot be made on demand over a real connection, so the service's queues are filled by hand."""

from __future__ import annotations

import asyncio

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.control.coordinator import Coordinator, RingStoreAddress
from ringmaster.rendezvous.server import grpc_service
from ringmaster.rendezvous.server.grpc_service import RendezvousService
from ringmaster.settings import JobSettings


def test_messages_left_in_an_ended_agent_session_go_on_the_workers_streams() -> None:
    settings = JobSettings(command=["python", "train.py"], min_np=1)
    service = RendezvousService(Coordinator(settings, "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                                            lambda g: ("127.0.0.1", 1000 + g)))
    mine: asyncio.Queue = asyncio.Queue()
    service.outbox.workers["hA/1"] = mine  # (hA/2 has no session: nothing to tell it)
    agent: asyncio.Queue = asyncio.Queue()
    assignment = pb.WorkerEvent(assignment=pb.Assignment(generation=4, rank=1, size=2))
    agent.put_nowait(pb.AgentCommand(workers=[pb.WorkerSpec(worker_id="hA/1")]))
    agent.put_nowait(pb.AgentCommand(events=[pb.HostedEvent(worker_id="hA/1", event=assignment),
                                             pb.HostedEvent(worker_id="hA/2", event=assignment)]))
    agent.put_nowait(grpc_service._REPLACED)
    service.outbox.reroute(agent)
    assert agent.empty() and mine.qsize() == 1
    assert mine.get_nowait() == assignment and service.outbox.messages["stream"] == 1
