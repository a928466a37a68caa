"""What anyone who can reach the rendezvous' ports can do without a key: hold connections,
stall HTTP requests, repeat refused calls; and what a key holder can do: open sessions for
invented hosts. A real job (or `serve`) each time; the flood comes from real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from harness import FAST, ROOT, WORKLOADS, credentials, elastic_job, wait_for

from ringmaster.common.grpc_auth import secured
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.rendezvous.server.grpc_limits import RESERVED_FILES, max_connections

pytestmark = pytest.mark.slow


def _flood(host: str, port: int, count: int, *flags: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(WORKLOADS / "flood.py"), host, str(port), str(count), *flags],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("open"), line
    return proc


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _healthy(url: str) -> bool:
    """GET /healthz answers, as a client that retries a connection reset once sees it: under a
    flood that holds every descriptor the server can spare, one new connection may be shed,
    the next must get through."""
    for attempt in (1, 2):
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
                return response.status == 200
        except ConnectionResetError:
            if attempt == 2:
                raise
    return False


#: Descriptors the job's processes may open (soft and hard): the flood holds more connections.
JOB_FILES = 4096


def test_more_idle_connections_than_the_job_has_descriptors_take_none_it_needs(run_job, tmp_path) -> None:
    """5,400 idle connections against a rendezvous that may open 4,096 files. (The machine's own
    limit made it 21,000 against 20,000: the ephemeral ports ran short, the third flood took 17 s
    to connect, the test 54-133 s.)"""
    import resource

    stop = tmp_path / "stop"  # the job trains until the flood has been measured, however long that takes
    job = run_job("-np", "2", *FAST, *elastic_job(tmp_path / "log", epochs=1000, samples=96, step_time=0.05),
                  "--stop-file", str(stop),
                  preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (JOB_FILES, JOB_FILES)))
    host, port = job.wait_event("rendezvous.listening")["address"].rsplit(":", 1)
    url = job.wait_api()
    before = job.wait_status(lambda s: s["steps"] >= 5, 120, "training")["steps"]
    soft = int(open(f"/proc/{job.proc.pid}/limits").read().split("Max open files")[1].split()[0])
    assert soft == JOB_FILES
    floods = [_flood(host, int(port), 1800) for _ in range(3)]  # 5,400, renewed as the server closes them
    try:
        started, most = time.monotonic(), [0]

        def flooded_and_trained_on() -> bool:
            """Sampled as it goes: the API answers and the descriptors stay bounded until the
            flood has run for 15 s and the job has trained 20 steps more under it."""
            assert _healthy(url)
            most[0] = max(most[0], _open_files(job.proc.pid))
            assert job.proc.poll() is None, job.output[-5000:]
            return time.monotonic() - started >= 15 and job.status()["steps"] > before + 20

        wait_for(flooded_and_trained_on, 120, "15 s of flood and 20 steps trained under it", interval_s=0.5)
        assert most[0] <= max_connections(soft) + RESERVED_FILES, (most[0], soft)
        stop.touch()
    finally:
        for flood in floods:
            flood.kill()
            flood.wait()
    assert job.wait(240) == 0, job.output[-3000:]
    assert not job.events("worker.failed") and len(job.events("generation.formed")) == 1


def test_one_peer_address_keeps_at_most_its_share_of_connections(run_job, tmp_path) -> None:
    """1,500 idle connections from 127.0.0.2 (another peer than the job's own 127.0.0.1): the
    newest beyond MAX_PER_PEER are shut down within seconds (before gRPC's own handshake timeout
    would close them all), and a new connection from another address is served meanwhile."""
    from ringmaster.rendezvous.server.grpc_limits import HANDSHAKE_TIMEOUT_S
    from ringmaster.rendezvous.server.peer_limit import MAX_PER_PEER

    serve = run_job("-H", "hostX:1", "--start-timeout", "120", "python", str(WORKLOADS / "collectives.py"),
                    str(tmp_path), verb="serve")
    address = serve.wait_event("rendezvous.listening")["address"]
    host, port = address.rsplit(":", 1)
    flood = _flood(host, int(port), 1500, "--from", "127.0.0.2", "--no-renew")
    try:
        started = time.monotonic()
        assert flood.stdout is not None
        closed = 0
        while closed < 1500 - MAX_PER_PEER:
            line = flood.stdout.readline()
            assert line.startswith("closed"), line
            closed = int(line.split()[1])
        assert time.monotonic() - started < HANDSHAKE_TIMEOUT_S - 2  # shed by the limit, not timed out
        with secured(grpc.insecure_channel(address), credentials("hostX")) as channel:
            assert pb_grpc.RendezvousStub(channel).AgentHeartbeat(pb.AgentHeartbeatRequest(host="hostX"), timeout=10).ok
        limited = serve.wait_event("rendezvous.peer_limited")
        assert limited["peer"] == "127.0.0.2" and limited["limit"] == MAX_PER_PEER
    finally:
        flood.kill()
        flood.wait()


def test_stalled_http_connections_renewed_never_keep_an_operator_out(run_job, tmp_path) -> None:
    serve = run_job("-H", "hostX:1", "--start-timeout", "120", "python", str(WORKLOADS / "collectives.py"),
                    str(tmp_path), verb="serve")
    url = serve.wait_api()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    flood = _flood(host, int(port), 400, "--http")  # far more than the API keeps; each closed one comes back
    try:
        answered = [0]

        def operator_served() -> bool:
            """One more `ringmaster status` through the flood; ten of them, a second apart at least."""
            assert _healthy(url)
            status = subprocess.run([sys.executable, "-m", "ringmaster.cli", "status", "--api", url], cwd=ROOT,
                                    capture_output=True, text=True, timeout=60)
            assert status.returncode == 0 and "hostX" in status.stdout, status.stderr
            answered[0] += 1
            return answered[0] >= 10

        wait_for(operator_served, 300, "ten status calls answered through the flood", interval_s=1.0)
    finally:
        flood.kill()
        flood.wait()


def test_sessions_for_invented_hosts_are_bounded_and_refusals_slow_their_sender(run_job, tmp_path) -> None:
    from ringmaster.rendezvous.server.grpc_service import MAX_UNLISTED_AGENTS

    serve = run_job("-H", "hostX:1", "--start-timeout", "120", "python", str(WORKLOADS / "collectives.py"),
                    str(tmp_path), verb="serve")
    address = serve.wait_event("rendezvous.listening")["address"]
    serve.wait_api()
    channels, streams, codes = [], [], []
    try:
        for i in range(MAX_UNLISTED_AGENTS + 6):  # each with its own host's key: what the job secret allows
            channel = secured(grpc.insecure_channel(address), credentials(f"invented{i}"))
            channels.append(channel)
            stream = pb_grpc.RendezvousStub(channel).AgentSession(pb.AgentHello(host=f"invented{i}", incarnation="x"))
            streams.append(stream)
            try:
                next(stream)
                codes.append("OK")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)
        assert codes == ["OK"] * MAX_UNLISTED_AGENTS + ["RESOURCE_EXHAUSTED"] * 6
        hosts = serve.status()["hosts"]
        assert len(hosts) == 1 + MAX_UNLISTED_AGENTS
        # Refused calls from one address: the first are answered at once, then slowly.
        with secured(grpc.insecure_channel(address), credentials("hostX", secret="x" * 32)) as wrong:
            stub = pb_grpc.RendezvousStub(wrong)
            took = []
            for _ in range(40):
                started = time.monotonic()
                with pytest.raises(grpc.RpcError):
                    stub.AgentHeartbeat(pb.AgentHeartbeatRequest(host="hostX"), timeout=10)
                took.append(time.monotonic() - started)
        assert sum(took[:15]) < 1.5, took  # the burst: at once
        assert sum(took[-10:]) >= 2.0, took  # then about two a second
        # The job's own agent is not slowed by its address' refusals.
        agent = run_job("--rendezvous", address, "--host", "hostX", verb="agent")
        wait_for(lambda: agent.events("process.started"), 60, "the real agent's worker")
    finally:
        for stream in streams:
            stream.cancel()
        for channel in channels:
            channel.close()
