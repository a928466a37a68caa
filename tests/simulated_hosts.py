"""Hosts simulated by the hundred in one process: an agent and its one worker each, speaking the
real gRPC protocol (grpc.aio clients) with real keys, for the rendezvous benchmarks.

The rendezvous they talk to is real; what they do is what a real agent and worker do in a
generation change: hello, the worker's session and heartbeat, Ready after a failure, an exit report.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
from typing import Any

import grpc
from harness import SECRET

from ringmaster.common.keys import AGENT, WORKER, Identity, key_of
from ringmaster.common.seal import body_of, call_metadata
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc


def signed(method: str, identity: Identity, request: Any, secret: str | None = SECRET) -> tuple[tuple[str, str], ...]:
    """Metadata proving `identity`'s key over one call of `method` with `request` (the simulated
    hosts are the job's; the answers' seals are not checked here: the rendezvous' cost is
    measured). Nothing for a rendezvous without a secret (`bench/auth.py`'s baseline)."""
    if secret is None:
        return ()
    return call_metadata(key_of(secret, identity), identity, f"/ringmaster.v1.Rendezvous/{method}", body_of(request),
                         time.time())


class SimulatedHost:
    """An agent and its one worker, speaking the real protocol."""

    def __init__(self, stub: pb_grpc.RendezvousStub, name: str, secret: str | None = SECRET) -> None:
        self.stub, self.name, self.secret = stub, name, secret
        self.worker_id: str | None = None
        self.generation = 0
        self.assigned = asyncio.Event()
        self.over = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.worker_call: Any = None

    async def run_agent(self) -> None:
        hello = pb.AgentHello(host=self.name, pid=os.getpid())
        async for command in self.stub.AgentSession(hello, wait_for_ready=True,
                                                 metadata=signed("AgentSession", Identity(AGENT, self.name), hello,
                                                                 self.secret)):
            for spec in command.workers:
                if self.worker_id is None:
                    self.worker_id = spec.worker_id
                    self.tasks.append(asyncio.create_task(self.run_worker()))

    async def run_worker(self) -> None:
        assert self.worker_id is not None
        me = Identity(WORKER, self.name, self.worker_id)
        hello = pb.WorkerHello(worker_id=self.worker_id, host=self.name, pid=os.getpid())
        self.worker_call = self.stub.WorkerSession(hello, metadata=signed("WorkerSession", me, hello, self.secret))
        beat = pb.WorkerHeartbeatRequest(worker_id=self.worker_id, elastic=True)
        await self.stub.WorkerHeartbeat(beat, metadata=signed("WorkerHeartbeat", me, beat, self.secret))
        try:
            async for event in self.worker_call:
                kind = event.WhichOneof("event")
                if kind == "assignment" and event.assignment.generation > self.generation:
                    self.generation = event.assignment.generation
                    self.assigned.set()
                elif kind == "generation_over" and event.generation_over.generation == self.generation:
                    self.over.set()
                    ready = pb.ReadyRequest(worker_id=self.worker_id, after_generation=self.generation,
                                            failure="peer died", elastic=True)
                    await self.stub.Ready(ready, metadata=signed("Ready", me, ready, self.secret))
        except grpc.aio.AioRpcError:
            pass

    async def die(self) -> None:
        assert self.worker_call is not None and self.worker_id is not None
        self.worker_call.cancel()
        report = pb.WorkerExit(host=self.name, worker_id=self.worker_id, signal=9)
        await self.stub.ReportWorkerExit(report,
                                         metadata=signed("ReportWorkerExit", Identity(AGENT, self.name), report,
                                                         self.secret))


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used (Linux /proc)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_change(address: str, count: int, server_pid: int, secret: str | None = SECRET) -> tuple[float, float]:
    """Seconds until every survivor holds its new assignment, and the server's CPU seconds meanwhile."""
    # Each host holds two streams; HTTP/2 allows about 100 concurrent streams per connection.
    channels = [grpc.aio.insecure_channel(address) for _ in range(max(1, count // 32))]
    hosts = [SimulatedHost(pb_grpc.RendezvousStub(channels[i % len(channels)]), f"h{i}", secret) for i in range(count)]
    agents = [asyncio.create_task(h.run_agent()) for h in hosts]
    try:
        await asyncio.wait_for(asyncio.gather(*(h.assigned.wait() for h in hosts)), 120)
        for h in hosts:
            h.assigned.clear()
        victim, survivors = hosts[-1], hosts[:-1]
        started, cpu_before = time.perf_counter(), cpu_seconds(server_pid)
        await victim.die()
        await asyncio.wait_for(asyncio.gather(*(h.assigned.wait() for h in survivors)), 120)
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(server_pid) - cpu_before
        assert {h.generation for h in survivors} == {2}
        return elapsed, cpu
    finally:
        for task in agents + [t for h in hosts for t in h.tasks]:
            task.cancel()
        for channel in channels:
            await channel.close()


