"""What authenticating every message costs: per call and per streamed message, on a heartbeat's
round trip and the rendezvous' CPU, and on a whole generation change at 8 and 512 workers.

1. The pure work, one process, no network: a unary call (the caller's token over its request,
   the rendezvous' check and replay window, the answer's MAC and its check) and one streamed
   message (sealed, checked).
2. A heartbeat: real gRPC servers (the same servicer with and without the rendezvous' guard),
   each in a process of its own so that its CPU time can be read from /proc, and a real client
   (the agents' and workers' interceptor) on loopback: the round trip, and the server's CPU per
   call with 64 calls in flight.
3. A generation change: a real rendezvous (`RendezvousServer`, as `ringmaster serve` builds it)
   with and without the job secret, and simulated hosts from `bench/rendezvous.py` (an agent and
   a worker each, speaking the real protocol, signing every call when there is a secret); a
   member dies and every survivor's new assignment is awaited, runs interleaved.

Run: python bench/auth.py [--calls 2000] [--agents 8,512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import pathlib
import signal
import statistics
import sys
import time

import grpc

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from harness import SECRET, credentials, free_port  # noqa: E402
from simulated_hosts import cpu_seconds, one_change  # noqa: E402

from ringmaster.common.grpc_auth import RendezvousAuth, secured  # noqa: E402
from ringmaster.common.keys import key_of  # noqa: E402
from ringmaster.common.seal import CallerSeal, Gate, body_of  # noqa: E402
from ringmaster.proto import ringmaster_pb2 as pb  # noqa: E402
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc  # noqa: E402

METHOD = "/ringmaster.v1.Rendezvous/AgentHeartbeat"


class _Heartbeats(pb_grpc.RendezvousServicer):
    async def AgentHeartbeat(self, request, context):
        return pb.Ack(ok=True)


def _serve(secret: str | None, port: multiprocessing.Queue) -> None:
    async def serve() -> None:
        servicer: object = _Heartbeats()
        if secret:
            servicer = RendezvousAuth(secret, lambda method,
                                      why: None).guard(servicer, pb.DESCRIPTOR.services_by_name["Rendezvous"])
        server = grpc.aio.server()
        pb_grpc.add_RendezvousServicer_to_server(servicer, server)
        port.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def _server(secret: str | None) -> tuple[multiprocessing.process.BaseProcess, str]:
    """A real server in a process of its own (None: no guard) and its address."""
    context = multiprocessing.get_context("spawn")  # no fork beside gRPC's threads
    port: multiprocessing.Queue = context.Queue()
    process = context.Process(target=_serve, args=(secret, port), daemon=True)
    process.start()
    return process, f"127.0.0.1:{port.get(timeout=60)}"


def pure_costs(calls: int) -> tuple[float, float]:
    """µs of one unary call's authentication (both ends) and of one streamed message's."""
    creds = credentials("bench")
    gate = Gate(lambda identity: key_of(SECRET, identity), lambda identity: None)
    request, answer = pb.AgentHeartbeatRequest(host="bench"), pb.Ack(ok=True)
    started = time.perf_counter()
    for _ in range(calls):
        seal = CallerSeal(creds.key, creds.identity, METHOD, body_of(request), time.time())
        admission, why = gate.check(METHOD, dict(seal.metadata)["ringmaster-auth"], body_of(request), time.time())
        assert admission is not None and gate.admit(admission, time.time()) is None, why
        assert seal.answered(admission.keys.answer(body_of(answer)), body_of(answer))
    unary = (time.perf_counter() - started) / calls * 1e6
    assert seal.opened(admission.keys.opening())
    started = time.perf_counter()
    for rank in range(calls):
        message = pb.WorkerEvent(assignment=pb.Assignment(generation=2, rank=rank, size=512, store_host="10.0.0.1",
                                                          store_port=29500, store_prefix="ringmaster/gen2/"))
        assert seal.message(pb.WorkerEvent.FromString(admission.seal(message).SerializeToString())) is None
    streamed = (time.perf_counter() - started) / calls * 1e6
    return unary, streamed


def heartbeat_us(address: str, signed: bool, calls: int, server_pid: int) -> float:
    """Median microseconds of one AgentHeartbeat round trip."""
    channel = secured(grpc.insecure_channel(address), credentials("bench") if signed else None)
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


def server_cpu_us(address: str, signed: bool, calls: int, server_pid: int, concurrency: int = 64) -> float:
    """The server's CPU µs per call under load: `concurrency` calls in flight at once, so the
    server is never idle (an idle grpc.aio server's polling would count as cost otherwise).
    The client signs like the agents do (a token per call over its request), in another process."""
    from simulated_hosts import signed as sign

    async def load() -> float:
        channel = grpc.aio.insecure_channel(address)
        stub = pb_grpc.RendezvousStub(channel)
        request = pb.AgentHeartbeatRequest(host="bench")
        identity = credentials("bench").identity

        async def caller(count: int) -> None:
            for _ in range(count):
                metadata = sign("AgentHeartbeat", identity, request) if signed else None
                await stub.AgentHeartbeat(request, timeout=30, metadata=metadata)

        try:
            await caller(200)
            before = cpu_seconds(server_pid)
            await asyncio.gather(*(caller(calls // concurrency) for _ in range(concurrency)))
            return (cpu_seconds(server_pid) - before) / (calls // concurrency * concurrency) * 1e6
        finally:
            await channel.close()

    return asyncio.run(load())


def _rendezvous(port: int, hosts: int, secret: str | None) -> None:
    """A rendezvous as `ringmaster serve` builds it, with or without the job secret."""
    from ringmaster.cli.main import build_parser, settings_from_args
    from ringmaster.common import logs
    from ringmaster.rendezvous.server.app import RendezvousServer

    logs.configure("text", "ERROR")
    args = build_parser().parse_args(
        ["serve", "-H", ",".join(f"h{i}:1" for i in range(hosts)), "--min-np", "1", "--port", str(port),
         "--heartbeat-interval", "5", "--heartbeat-timeout", "120", "--start-timeout", "120", "python", "-c", "pass"])
    settings, discovery, initial = settings_from_args(args)
    server = RendezvousServer(settings, discovery, port=port, api_port=None, local_hosts=False, launcher="none",
                              secret=secret)
    asyncio.run(server.run(initial))


async def generation_changes(agents: list[int],
                             repeats: int) -> list[tuple[int, list[float], list[float], list[float], list[float]]]:
    """For each count: (count, seconds and server CPU seconds of a change, unsigned; the same, signed)."""
    context = multiprocessing.get_context("spawn")
    rows = []
    for count in agents:
        figures: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
        for _ in range(repeats):
            for signed in (False, True):  # interleaved, so drift in the machine's load hits both alike
                port = free_port()
                process = context.Process(target=_rendezvous, args=(port, count, SECRET if signed else None),
                                          daemon=True)
                process.start()
                try:
                    elapsed, cpu = await one_change(f"127.0.0.1:{port}", count, process.pid, SECRET if signed else None)
                finally:
                    os.kill(process.pid, signal.SIGKILL)
                    process.join()
                figures[signed][0].append(elapsed)
                figures[signed][1].append(cpu)
        rows.append((count, *figures[False], *figures[True]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--agents", default="8,512")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    unary, streamed = pure_costs(args.calls)

    (plain_server, plain_address), (signed_server, signed_address) = _server(None), _server(SECRET)
    plain, signed, loaded_plain, loaded_signed = [], [], [], []
    try:
        for _ in range(3):  # interleaved, so drift in the machine's load hits both alike
            plain.append(heartbeat_us(plain_address, False, args.calls, plain_server.pid))
            signed.append(heartbeat_us(signed_address, True, args.calls, signed_server.pid))
            loaded_plain.append(server_cpu_us(plain_address, False, args.calls * 5, plain_server.pid))
            loaded_signed.append(server_cpu_us(signed_address, True, args.calls * 5, signed_server.pid))
    finally:
        for server in (plain_server, signed_server):
            server.kill()
            server.join()

    def cell(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
        shown = ", ".join(f"{v * scale:.{digits}f}" for v in values)
        return f"{statistics.median(values) * scale:.{digits}f} ({shown})"

    print(f"## Every message authenticated: what it costs ({args.calls} calls per run, 3 runs, median (each))")
    print(f"- pure work, both ends, one process: a unary call {unary:.1f} µs; a streamed message {streamed:.1f} µs\n")
    print("| heartbeat | round trip µs | rendezvous CPU µs per call, 64 calls in flight |")
    print("| --- | --- | --- |")
    print(f"| no keys | {cell(plain)} | {cell(loaded_plain)} |")
    print(f"| every message authenticated | {cell(signed)} | {cell(loaded_signed)} |")
    print(f"| difference | {statistics.median(signed) - statistics.median(plain):+.0f} | "
          f"{statistics.median(loaded_signed) - statistics.median(loaded_plain):+.0f} |")

    rows = asyncio.run(generation_changes([int(a) for a in args.agents.split(",")], args.repeats))
    print("\n## A member dies: until every survivor holds its new assignment (a real rendezvous, simulated hosts)")
    print("| workers | no keys: ms | server CPU ms | every message authenticated: ms | server CPU ms |")
    print("| --- | --- | --- | --- | --- |")
    for count, plain_s, plain_cpu, signed_s, signed_cpu in rows:
        print(f"| {count} | {cell(plain_s, 1e3, 1)} | {cell(plain_cpu, 1e3)} | {cell(signed_s, 1e3, 1)} | "
              f"{cell(signed_cpu, 1e3)} |")


if __name__ == "__main__":
    main()
