"""The gRPC face of the rendezvous: turns RPCs into coordinator calls and its outbox into streams.

Runs on one asyncio loop, so the coordinator is only ever touched from that loop's thread and
needs no lock. Each agent and worker session owns an asyncio queue; a closed stream (the process
died, the host was lost) is reported to the coordinator at once, which is how a killed worker is
noticed in milliseconds rather than after a heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable

import grpc

from proto import ringmaster_pb2 as pb
from proto import ringmaster_pb2_grpc as pb_grpc
from rendezvous.coordinator import Coordinator

Clock = Callable[[], float]


class RendezvousService(pb_grpc.RendezvousServicer):
    def __init__(self, coordinator: Coordinator, clock: Clock = time.monotonic) -> None:
        self.coordinator = coordinator
        self.clock = clock
        self._agents: dict[str, asyncio.Queue] = {}
        self._workers: dict[str, asyncio.Queue] = {}
        self.changed = asyncio.Event()  # set after every coordinator call; the job loop watches it

    # ---------------------------------------------------------------- plumbing
    def call(self, method: Callable, *args):
        """Run a coordinator method with the current time, then deliver its outbox."""
        result = method(*args, self.clock())
        self.flush()
        return result

    def flush(self) -> None:
        for kind, target, message in self.coordinator.drain():
            queue = (self._agents if kind == "agent" else self._workers).get(target)
            if queue is not None:
                queue.put_nowait(message)
        self.changed.set()

    async def _pump(self, sessions: dict[str, asyncio.Queue], key: str, queue: asyncio.Queue,
                    is_last: Callable[[Any], bool], on_close: Callable) -> AsyncIterator:
        """Stream a session's queue until its last message or until the peer goes away; a peer
        that goes away (process died, host lost) is reported to the coordinator at once."""
        try:
            while True:
                message = await queue.get()
                yield message
                if is_last(message):
                    return
        finally:
            if sessions.get(key) is queue:
                del sessions[key]
                self.call(on_close, key)

    # ---------------------------------------------------------------- agents
    async def AgentSession(self, request: pb.AgentHello, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.AgentCommand]:
        queue: asyncio.Queue = asyncio.Queue()
        self._agents[request.host] = queue
        self.call(self.coordinator.agent_connected, request.host, request.pid)
        async for message in self._pump(self._agents, request.host, queue, lambda m: m.shutdown,
                                        self.coordinator.agent_disconnected):
            yield message

    async def AgentHeartbeat(self, request: pb.AgentHeartbeatRequest, context) -> pb.Ack:
        self.coordinator.agent_heartbeat(request.host, self.clock())
        return pb.Ack(ok=True)

    async def ReportWorkerExit(self, request: pb.WorkerExit, context) -> pb.Ack:
        self.call(
            self.coordinator.worker_exited,
            request.host, request.worker_id, request.exit_code, request.signal, request.stopped_by_agent,
        )
        return pb.Ack(ok=True)

    # ---------------------------------------------------------------- workers
    async def WorkerSession(self, request: pb.WorkerHello, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WorkerEvent]:
        queue: asyncio.Queue = asyncio.Queue()
        self._workers[request.worker_id] = queue
        error = self.call(self.coordinator.worker_connected, request.worker_id, request.pid)
        if error:
            del self._workers[request.worker_id]
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, error)
        async for message in self._pump(self._workers, request.worker_id, queue,
                                        lambda m: m.HasField("job_ended") or m.HasField("retire"),
                                        self.coordinator.worker_disconnected):
            yield message

    async def Ready(self, request: pb.ReadyRequest, context) -> pb.Ack:
        error = self.call(
            self.coordinator.worker_ready, request.worker_id, request.after_generation, request.failure, request.elastic
        )
        return pb.Ack(ok=error is None, message=error or "")

    async def WorkerHeartbeat(self, request: pb.WorkerHeartbeatRequest, context) -> pb.Ack:
        self.call(self.coordinator.worker_heartbeat, request.worker_id, request.commits, request.elastic)
        return pb.Ack(ok=True)

    async def ReportDone(self, request: pb.DoneRequest, context) -> pb.Ack:
        self.call(self.coordinator.worker_done, request.worker_id, request.commits)
        return pb.Ack(ok=True)
