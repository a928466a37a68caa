"""What the job secret costs: a heartbeat's round trip with and without signed calls, and the
rendezvous' CPU time per call.

Real gRPC servers (one with the rendezvous' own interceptor, one without), each in a process of
its own so that its CPU time can be read from /proc, and a real client (the agents' and workers'
interceptor) on loopback; the same servicer answers both ways, so the difference is the signing,
the check, the nonce memory and the proof. Also the pure signing and checking alone, per call.
A generation change costs the rendezvous about three calls per worker (its stream's message,
Ready, a heartbeat), so the CPU figure times three is the secret's share of a change per worker.

Run: python bench/auth.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import pathlib
import statistics
import time

import grpc

from ringmaster.common.grpc_auth import RendezvousAuth, secured
from ringmaster.common.secret import TOKEN_KEY, TokenChecker, generate_secret, make_token
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc


class _Heartbeats(pb_grpc.RendezvousServicer):
    async def AgentHeartbeat(self, request, context):
        return pb.Ack(ok=True)


def _serve(secret: str | None, port: multiprocessing.Queue) -> None:
    async def serve() -> None:
        servicer: object = _Heartbeats()
        if secret:
            servicer = RendezvousAuth(secret, lambda method, why: None).guard(servicer, pb.DESCRIPTOR.services_by_name["Rendezvous"])
        server = grpc.aio.server()
        pb_grpc.add_RendezvousServicer_to_server(servicer, server)
        port.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def _server(secret: str | None) -> tuple[multiprocessing.process.BaseProcess, str]:
    """A real server in a process of its own (None: no interceptor) and its address."""
    context = multiprocessing.get_context("spawn")  # no fork beside gRPC's threads
    port: multiprocessing.Queue = context.Queue()
    process = context.Process(target=_serve, args=(secret, port), daemon=True)
    process.start()
    return process, f"127.0.0.1:{port.get(timeout=60)}"


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used (Linux /proc)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def heartbeat_us(address: str, secret: str | None, calls: int, server_pid: int) -> tuple[float, float]:
    """Median microseconds of one AgentHeartbeat round trip, and the server's CPU µs per call."""
    channel = secured(grpc.insecure_channel(address), secret)
    stub = pb_grpc.RendezvousStub(channel)
    request = pb.AgentHeartbeatRequest(host="bench")
    try:
        for _ in range(200):  # warm-up: connection, caches
            stub.AgentHeartbeat(request, timeout=10)
        times = []
        cpu_before = cpu_seconds(server_pid)
        for _ in range(calls):
            started = time.perf_counter()
            stub.AgentHeartbeat(request, timeout=10)
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e6, (cpu_seconds(server_pid) - cpu_before) / calls * 1e6
    finally:
        channel.close()


def server_cpu_us(address: str, secret: str | None, calls: int, server_pid: int, concurrency: int = 64) -> float:
    """The server's CPU µs per call under load: `concurrency` calls in flight at once, so the
    server is never idle (an idle grpc.aio server's polling would count as cost otherwise).
    The client signs like the agents do (tokens made per call), in another process."""

    async def load() -> float:
        channel = grpc.aio.insecure_channel(address)
        stub = pb_grpc.RendezvousStub(channel)
        request = pb.AgentHeartbeatRequest(host="bench")
        method = "/ringmaster.v1.Rendezvous/AgentHeartbeat"

        def metadata() -> list[tuple[str, str]] | None:
            return [(TOKEN_KEY, make_token(secret, method, time.time())[0])] if secret else None

        async def caller(count: int) -> None:
            for _ in range(count):
                await stub.AgentHeartbeat(request, timeout=30, metadata=metadata())

        try:
            await caller(200)
            before = cpu_seconds(server_pid)
            await asyncio.gather(*(caller(calls // concurrency) for _ in range(concurrency)))
            return (cpu_seconds(server_pid) - before) / (calls // concurrency * concurrency) * 1e6
        finally:
            await channel.close()

    return asyncio.run(load())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    secret = generate_secret()

    checker = TokenChecker(secret)
    method = "/ringmaster.v1.Rendezvous/AgentHeartbeat"
    started = time.perf_counter()
    for _ in range(args.calls):
        token, _ = make_token(secret, method, time.time())
        checker.check(method, token, time.time())
    pure = (time.perf_counter() - started) / args.calls * 1e6

    (plain_server, plain_address), (signed_server, signed_address) = _server(None), _server(secret)
    plain, signed, loaded_plain, loaded_signed = [], [], [], []
    try:
        for _ in range(3):  # interleaved, so drift in the machine's load hits both alike
            plain.append(heartbeat_us(plain_address, None, args.calls, plain_server.pid))
            signed.append(heartbeat_us(signed_address, secret, args.calls, signed_server.pid))
            loaded_plain.append(server_cpu_us(plain_address, None, args.calls * 5, plain_server.pid))
            loaded_signed.append(server_cpu_us(signed_address, secret, args.calls * 5, signed_server.pid))
    finally:
        for server in (plain_server, signed_server):
            server.kill()
            server.join()

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.0f} ({', '.join(f'{v:.0f}' for v in values)})"

    print(f"## The job secret's cost ({args.calls} calls per run, 3 runs, median of each)")
    print("| | heartbeat round trip µs | rendezvous CPU µs per call, 64 calls in flight |")
    print("| --- | --- | --- |")
    print(f"| sign + check a token (no network, one process) | {pure:.1f} | |")
    print(f"| no secret | {cell([r[0] for r in plain])} | {cell(loaded_plain)} |")
    print(f"| signed and proven | {cell([r[0] for r in signed])} | {cell(loaded_signed)} |")
    cpu = statistics.median(loaded_signed) - statistics.median(loaded_plain)
    print(f"| difference | {statistics.median(r[0] for r in signed) - statistics.median(r[0] for r in plain):+.0f} | "
          f"{cpu:+.0f} |")
    print(f"\nA generation change costs the rendezvous about 3 calls per worker: the secret's share is about "
          f"{3 * cpu * 512 / 1e3:.0f} ms of its CPU at 512 workers, {3 * cpu * 8 / 1e3:.2f} ms at 8.")


if __name__ == "__main__":
    main()
