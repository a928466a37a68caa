"""What the job secret costs: a heartbeat's round trip with and without signed calls.

A real gRPC server (the rendezvous' own interceptor, in a thread of its own) and a real client
(the agents' and workers' interceptor) on loopback; the same servicer answers both ways, so
the difference is the signing, the check, the nonce memory and the proof. Also the pure
signing and checking alone, per call.

Run: python bench/auth.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

import grpc

from ringmaster.common.grpc_auth import RendezvousAuth, secured
from ringmaster.common.secret import TokenChecker, generate_secret, make_token
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc


class _Heartbeats(pb_grpc.RendezvousServicer):
    async def AgentHeartbeat(self, request, context):
        return pb.Ack(ok=True)


def _servers(secret: str) -> dict[str | None, str]:
    """Two real servers on one loop (grpc.aio keeps to the first loop it sees), in a daemon thread
    that ends with the process: addresses by secret (None: no interceptor)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    addresses: dict[str | None, str] = {}

    async def serve() -> None:
        servers = []  # kept: a server that is garbage-collected stops
        for key in (None, secret):
            interceptors = [RendezvousAuth(key, lambda method, why: None)] if key else None
            server = grpc.aio.server(interceptors=interceptors)
            pb_grpc.add_RendezvousServicer_to_server(_Heartbeats(), server)
            addresses[key] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
            await server.start()
            servers.append(server)
        ready.set()
        await asyncio.Event().wait()

    threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True).start()
    ready.wait(30)
    return addresses


def heartbeat_us(address: str, secret: str | None, calls: int) -> float:
    """Median microseconds of one AgentHeartbeat round trip."""
    channel = secured(grpc.insecure_channel(address), secret)
    stub = pb_grpc.RendezvousStub(channel)
    request = pb.AgentHeartbeatRequest(host="bench")
    try:
        for _ in range(200):  # warm-up: connection, caches
            stub.AgentHeartbeat(request, timeout=10)
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            stub.AgentHeartbeat(request, timeout=10)
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e6
    finally:
        channel.close()


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

    addresses = _servers(secret)
    plain, signed = [], []
    for _ in range(3):  # interleaved, so drift in the machine's load hits both alike
        plain.append(heartbeat_us(addresses[None], None, args.calls))
        signed.append(heartbeat_us(addresses[secret], secret, args.calls))
    print(f"## The job secret's cost ({args.calls} calls per run, 3 runs, median of each)")
    print("| | µs per call |")
    print("| --- | --- |")
    print(f"| sign + check a token (no network) | {pure:.1f} |")
    print(f"| heartbeat round trip, no secret | {statistics.median(plain):.0f} ({', '.join(f'{t:.0f}' for t in plain)}) |")
    print(f"| heartbeat round trip, signed and proven | {statistics.median(signed):.0f} ({', '.join(f'{t:.0f}' for t in signed)}) |")
    print(f"| difference | {statistics.median(signed) - statistics.median(plain):+.0f} |")


if __name__ == "__main__":
    main()
