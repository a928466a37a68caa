"""Trust between the parts of a job: every gRPC message proves a key derived from the job secret,
in both directions, and each key proves one role.

A real `ringmaster serve`/`run` and real `ringmaster agent` processes; the hostile callers are
real gRPC clients on loopback, a relay between an agent and the rendezvous is a real gRPC server
that forwards the agent's own calls, the rendezvous an agent is pointed at is a real gRPC server
that answers with a command to run, and the hostile training script is a real worker. Each case
of the threat list must do nothing at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import threading
import time
import urllib.error
import urllib.request
from typing import Iterator

import grpc
import pytest
from harness import API_HEADERS, SECRET, WORKLOADS, credentials, elastic_job, wait_for

from ringmaster.common.grpc_auth import RendezvousAuth, secured
from ringmaster.common.keys import key_of
from ringmaster.common.seal import CallerSeal, body_of
from ringmaster.common.secret import generate_secret
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

METHOD = "/ringmaster.v1.Rendezvous/AgentHeartbeat"


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_calls_without_the_key_of_their_caller_are_refused_and_change_nothing(run_job, tmp_path) -> None:
    # The job trains until told to stop: a second agent that took its time to warm up must find the
    # first one still connected (a CI run had the job end first, and the late agent was welcome).
    stop = tmp_path / "stop"
    serve = run_job("-H", "hostX:2", "--start-timeout", "120", *elastic_job(tmp_path / "log", epochs=100000),
                    "--stop-file", str(stop), verb="serve")
    address = serve.wait_event("rendezvous.listening")["address"]
    serve.wait_api()
    other_job = generate_secret()
    for creds in (None, credentials("hostX", secret=other_job), credentials("hostX", "hostX/1", secret=other_job)):
        channel = secured(grpc.insecure_channel(address), creds)
        stub = pb_grpc.RendezvousStub(channel)
        try:
            calls = {
                "AgentSession": lambda: next(iter(stub.AgentSession(pb.AgentHello(host="hostX", pid=1), timeout=10))),
                "ReportWorkerExit": lambda: stub.ReportWorkerExit(pb.WorkerExit(host="hostX",
                                                                                worker_id="hostX/1", exit_code=1),
                                                                  timeout=10),
                "Ready": lambda: stub.Ready(pb.ReadyRequest(worker_id="hostX/1", failure="forged"), timeout=10),
                "ReportDone": lambda: stub.ReportDone(pb.DoneRequest(worker_id="hostX/1"), timeout=10),
                "WorkerSession": lambda: next(iter(stub.WorkerSession(pb.WorkerHello(worker_id="hostX/1",
                                                                                     host="hostX"), timeout=10))),
                "AgentHeartbeat": lambda: stub.AgentHeartbeat(pb.AgentHeartbeatRequest(host="hostX"), timeout=10),
                "CarryReady": lambda: stub.CarryReady(pb.CarriedReady(host="hostX", ready=[
                    pb.ReadyRequest(worker_id="hostX/1", failure="forged")]), timeout=10),
            }
            for name, call in calls.items():
                assert _code(call) == grpc.StatusCode.UNAUTHENTICATED, name
        finally:
            channel.close()
    # A call seen on the wire works once, for its request only.
    request = pb.AgentHeartbeatRequest(host="hostX")
    seal = CallerSeal(key_of(SECRET, credentials("hostX").identity), credentials("hostX").identity, METHOD,
                      body_of(request), time.time())
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.RendezvousStub(channel)
    try:
        stub.AgentHeartbeat(request, metadata=seal.metadata, timeout=10)
        assert _code(lambda: stub.AgentHeartbeat(request, metadata=seal.metadata, timeout=10)) \
            == grpc.StatusCode.UNAUTHENTICATED  # replayed
        assert _code(lambda: stub.AgentHeartbeat(pb.AgentHeartbeatRequest(host="hostY"), metadata=seal.metadata,
                                                 timeout=10)) == grpc.StatusCode.UNAUTHENTICATED  # another request
        assert _code(lambda: stub.ReportDone(pb.DoneRequest(worker_id="hostX/1"), metadata=seal.metadata,
                                             timeout=10)) == grpc.StatusCode.UNAUTHENTICATED  # another method
    finally:
        channel.close()
    status = serve.status()
    assert status["refused_calls"] == 24 and status["state"] == "starting", status
    assert [h["name"] for h in status["hosts"]] == ["hostX"] and not status["hosts"][0]["agent_connected"]
    assert serve.events("rendezvous.call_refused")

    # The control API: no change without the secret; reading the status is open on loopback only.
    url = serve.api_url
    for headers in ({"Content-Type": "application/json"}, {**API_HEADERS, "Authorization": "Bearer wrong"}):
        request_ = urllib.request.Request(f"{url}/scale", data=b'{"np": 1}', method="POST", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request_, timeout=10)
        assert info.value.code == 401 and "job secret" in json.load(info.value)["detail"]
    assert serve.status()["target_np"] is None

    # The real agent (with the secret) runs the job; a second agent for the same host is refused.
    agent = run_job("--rendezvous", address, "--host", "hostX", verb="agent")
    serve.wait_status(lambda s: s["hosts"][0]["agent_connected"], 60, "the real agent")
    second = run_job("--rendezvous", address, "--host", "hostX", verb="agent")
    assert second.wait(60) == 2
    assert second.events("agent.refused") and "already has an agent connected" in second.output
    # An agent's key speaks for its own host only: an exit report for a worker of another host,
    # or for another host, is refused.
    worker = serve.wait_status(lambda s: s["workers"], 60, "workers")["workers"][0]["worker_id"]
    for host, creds in (("hostY", credentials("hostY")), ("hostX", credentials("hostY"))):
        with secured(grpc.insecure_channel(address), creds) as channel:
            assert _code(lambda: pb_grpc.RendezvousStub(channel).ReportWorkerExit(
                pb.WorkerExit(host=host, worker_id=worker,
                              exit_code=1), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    stop.touch()
    assert serve.wait(180) == 0, serve.output
    code = agent.wait(60)
    assert code == 0, f"agent exited with {code}:\n{agent.output}\n--- serve:\n{serve.output}"
    assert not serve.events("host.blacklisted")


def test_a_training_script_holds_its_own_key_only_and_can_act_for_nothing_else(run_job, tmp_path) -> None:
    """Everything in the worker's environment and in /proc: it cannot open its agent's session,
    report another worker's exit, or speak for another worker; each try is refused, logged and
    counted, and the job trains on untouched."""
    job = run_job("-H", "hostA:1,hostB:1", "python", str(WORKLOADS / "hostile_worker.py"), str(tmp_path))
    assert job.wait(180) == 0, job.output
    reports = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("host*.json")}
    assert sorted(reports) == ["hostA_1", "hostB_2"], job.output
    for worker, report in reports.items():
        assert report["found"] == {"own_environment": [], "agent_environment": []}, worker
        attempts = report["attempts"]
        assert attempts.pop("its own heartbeat") == "OK", worker  # the control: its key works for itself
        assert attempts == {
            "agent session for its host": "PERMISSION_DENIED",
            "exit of another host's worker": "PERMISSION_DENIED",
            "ready for another worker": "PERMISSION_DENIED",
            "readies carried for another worker": "PERMISSION_DENIED",
            "done for another worker": "PERMISSION_DENIED",
            "its key as its agent": "UNAUTHENTICATED",
            "its key as another host's agent": "UNAUTHENTICATED",
            "its key as another worker": "UNAUTHENTICATED",
        }, worker
        assert report["sum"] == [2.0] * 4 and report["size"] == 2
    refused = job.events("rendezvous.call_refused")
    assert len(refused) == 16, [e["fields"] for e in refused]
    assert not job.events("host.blacklisted") and not job.events("worker.failed")
    assert len(job.events("generation.formed")) == 1


class _PosingRendezvous(pb_grpc.RendezvousServicer):
    """Answers an agent's hello with a worker that writes a file: what a hostile server would send."""

    def __init__(self) -> None:
        self.marker: pathlib.Path | None = None
        self.hellos = 0

    async def AgentSession(self, request, context):
        self.hellos += 1
        yield pb.AgentCommand(
            workers=[
                pb.WorkerSpec(
                    worker_id=f"{request.host}/1", argv=[b"/bin/sh", b"-c", os.fsencode(f"id > {self.marker}")]
                )
            ]
        )
        await asyncio.sleep(30)

    async def AgentHeartbeat(self, request, context):
        return pb.Ack(ok=True)

    async def ReportWorkerExit(self, request, context):
        return pb.Ack(ok=True)


@pytest.fixture(scope="module")
def posing() -> Iterator[dict[bool, tuple[str, _PosingRendezvous]]]:
    """Two real gRPC servers posing as the rendezvous, on loopback, one of them knowing the job
    secret; on one event loop in a thread of its own (grpc.aio keeps to the first loop it sees)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    servers: dict[bool, tuple[str, _PosingRendezvous]] = {}
    running: list[grpc.aio.Server] = []

    async def serve() -> None:
        for knows in (False, True):
            servicer = _PosingRendezvous()
            guarded = RendezvousAuth(SECRET, lambda method, why: None).guard(servicer,
                                                                             pb.DESCRIPTOR.services_by_name["Rendezvous"])
            server = grpc.aio.server()
            pb_grpc.add_RendezvousServicer_to_server(guarded if knows else servicer, server)
            servers[knows] = (f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}", servicer)
            await server.start()
            running.append(server)
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(30)
    assert started.is_set()
    try:
        yield servers
    finally:
        for server in running:
            asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.mark.parametrize("knows_secret", [False, True])
def test_an_agent_obeys_only_a_rendezvous_that_proves_its_key(run_job, tmp_path, posing, knows_secret) -> None:
    address, servicer = posing[knows_secret]
    servicer.marker = marker = tmp_path / "code-ran"
    agent = run_job("--rendezvous", address, "--host", "nodeA", "--reconnect-timeout", "3", verb="agent")
    if knows_secret:  # the control: a server that proves the secret is obeyed, so the test can fail
        wait_for(lambda: marker.exists(), 60, "the command of a proven rendezvous")
        return
    assert agent.wait(60) == 1, agent.output  # gave up on the address: nothing there is the job's
    assert agent.events("agent.unproven") and servicer.hellos >= 1
    assert not agent.events("process.started")
    assert not marker.exists()


class _Relay(pb_grpc.RendezvousServicer):
    """On the path between an agent and the rendezvous, without any key: forwards the agent's own
    calls (its signed metadata and request) to the real rendezvous and the real answers back,
    proofs included; after the first real command it tampers with the stream as `mode` says."""

    def __init__(self) -> None:
        self.upstream = ""
        self.mode = "faithful"
        self.marker: pathlib.Path | None = None
        self.tampered = 0

    @staticmethod
    def _theirs(context) -> tuple[tuple[str, str], ...]:
        return tuple((k, v) for k, v in context.invocation_metadata() if k.startswith("ringmaster-"))

    def _hostile(self, real: pb.AgentCommand) -> pb.AgentCommand:
        argv = [b"/bin/sh", b"-c", os.fsencode(f"id > {self.marker}")]
        if self.mode == "inject":  # a command of its own, sealed with nonsense
            forged = pb.AgentCommand(workers=[*real.workers, pb.WorkerSpec(worker_id="hostR/666", argv=argv)])
            forged.seal.sequence, forged.seal.mac = real.seal.sequence + 1, b"\0" * 32
            return forged
        if self.mode == "substitute":  # the real message with its seal, the command swapped
            forged = pb.AgentCommand()
            forged.CopyFrom(real)
            forged.workers[0].argv[:] = argv
            return forged
        return real  # "replay": the real message once more

    async def AgentSession(self, request, context):
        async with grpc.aio.insecure_channel(self.upstream) as channel:
            call = pb_grpc.RendezvousStub(channel).AgentSession(request, metadata=self._theirs(context))
            await context.send_initial_metadata(tuple(await call.initial_metadata()))
            async for message in call:
                if self.mode == "faithful" or not message.workers:
                    yield message
                    continue
                if self.mode == "substitute":
                    self.tampered += 1
                    yield self._hostile(message)
                    continue
                yield message
                self.tampered += 1
                yield self._hostile(message)

    async def _unary(self, name: str, request, context):
        async with grpc.aio.insecure_channel(self.upstream) as channel:
            call = getattr(pb_grpc.RendezvousStub(channel), name)(request, metadata=self._theirs(context))
            try:
                answer = await call
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "", tuple(exc.trailing_metadata() or ()))
            context.set_trailing_metadata(tuple(await call.trailing_metadata()))
            return answer

    async def AgentHeartbeat(self, request, context):
        return await self._unary("AgentHeartbeat", request, context)

    async def ReportWorkerExit(self, request, context):
        return await self._unary("ReportWorkerExit", request, context)


@pytest.fixture
def relay() -> Iterator[tuple[str, _Relay]]:
    """A relay on loopback, on an event loop in a thread of its own."""
    loop = asyncio.new_event_loop()
    servicer = _Relay()
    holder: list = []

    async def serve() -> str:
        server = grpc.aio.server()
        pb_grpc.add_RendezvousServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        holder.append(server)
        return f"127.0.0.1:{port}"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    address = asyncio.run_coroutine_threadsafe(serve(), loop).result(30)
    try:
        yield address, servicer
    finally:
        asyncio.run_coroutine_threadsafe(holder[0].stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.mark.parametrize("mode", ["inject", "substitute", "replay"])
def test_a_relay_without_the_key_can_make_an_agent_run_nothing(run_job, tmp_path, relay, mode) -> None:
    """The agent's own signed session goes through the relay to the real rendezvous, and the
    real proof comes back; what the relay adds, swaps or repeats in the stream is not obeyed:
    the agent drops the session, says why, and runs nothing of it."""
    address, servicer = relay
    servicer.marker, servicer.mode = tmp_path / "code-ran", mode
    marker = servicer.marker
    serve = run_job("-H", "hostR:1", "--start-timeout", "120", "python", str(WORKLOADS / "collectives.py"),
                    str(tmp_path), verb="serve")
    servicer.upstream = serve.wait_event("rendezvous.listening")["address"]
    agent = run_job("--rendezvous", address, "--host", "hostR", "--reconnect-timeout", "30", verb="agent")
    unproven = agent.wait_event("agent.unproven", 90)
    assert servicer.tampered >= 1
    expected = {"inject": "does not carry this session's MAC", "substitute": "does not carry this session's MAC",
                "replay": "came where message 2 was due"}[mode]
    assert expected in unproven["error"], unproven
    assert not marker.exists()
    started = [e["worker"] for e in agent.events("process.started")]
    assert "hostR/666" not in started
    if mode != "substitute":  # the control: the real command, relayed as it was, is obeyed
        assert started and started[0] == "hostR/1", agent.output
    else:
        assert started == [], agent.output


def test_a_job_over_tls_trains_and_nothing_speaks_to_it_in_the_clear(run_job, tmp_path) -> None:
    import ssl
    import subprocess
    import sys

    from harness import FAST, ROOT, elastic_job
    from tls_files import make_tls_files

    from ringmaster.common import tls

    files = make_tls_files(tmp_path / "tls")
    job = run_job("-np", "2", "--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca, *FAST,
                  *elastic_job(tmp_path / "log", epochs=3, samples=192))
    address = job.wait_event("rendezvous.listening")["address"]
    url = job.wait_event("api.listening")["url"]
    assert url.startswith("https://127.0.0.1:")
    request = pb.AgentHeartbeatRequest(host="localhost")
    plain = secured(grpc.insecure_channel(address), credentials("localhost"))
    other = secured(tls.channel(address, make_tls_files(tmp_path / "other").ca.read_bytes()), credentials("localhost"))
    trusted = secured(tls.channel(address, files.ca.read_bytes()), credentials("localhost"))
    try:
        for channel in (plain, other):
            assert _code(lambda: pb_grpc.RendezvousStub(channel).AgentHeartbeat(request, timeout=10)) \
                == grpc.StatusCode.UNAVAILABLE
        assert pb_grpc.RendezvousStub(trusted).AgentHeartbeat(request, timeout=10).ok
    finally:
        for channel in (plain, other, trusted):
            channel.close()
    context = ssl.create_default_context(cafile=str(files.ca))
    status_request = urllib.request.Request(f"{url}/status", headers={"Authorization": API_HEADERS["Authorization"]})
    with urllib.request.urlopen(status_request, timeout=10, context=context) as response:
        assert json.load(response)["state"] in ("starting", "running")
    with pytest.raises(OSError):  # plain HTTP to the TLS port gets no answer it can read
        urllib.request.urlopen(url.replace("https://", "http://") + "/healthz", timeout=10).read()
    scaled = subprocess.run([sys.executable, "-m", "ringmaster.cli", "scale", "--api", url, "-np", "2",
                             "--tls-ca", str(files.ca)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert scaled.returncode == 0 and "scaling to 2 workers" in scaled.stdout, scaled.stderr
    assert job.wait(240) == 0, job.output


def test_the_rings_store_listens_only_where_the_rendezvous_binds(run_job, tmp_path) -> None:
    import subprocess

    serve = run_job("-H", "hostX:1", "--bind", "127.0.0.1", "python", str(WORKLOADS / "collectives.py"), str(tmp_path),
                    verb="serve")
    serve.wait_event("rendezvous.listening")
    serve.wait_api()
    def listening() -> list[str]:
        table = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
        return [line.split()[3].replace("[::ffff:", "").replace("]", "")
                for line in table.splitlines() if f"pid={serve.proc.pid}," in line]

    mine = wait_for(lambda: (lambda found: found if len(found) >= 3 else None)(listening()), 30,
                    "gRPC, the control API and the rings' store to listen")
    assert all(address.startswith("127.0.0.1:") for address in mine), mine
