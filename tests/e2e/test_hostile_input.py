"""Bad input at a running rendezvous: it is refused with a message naming it, and the job's
state is untouched. A real `ringmaster serve`, real gRPC calls and a real agent process."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
from harness import ROOT, WORKLOADS, credentials

from ringmaster.common.grpc_auth import secured
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow


def test_agent_hellos_with_bad_host_names_are_refused(run_job, tmp_path) -> None:
    serve = run_job("-H", "hostX:1", "--start-timeout", "60", "python", str(WORKLOADS / "collectives.py"),
                    str(tmp_path),
                    verb="serve")
    address = serve.wait_event("rendezvous.listening")["address"]
    for host, code, fragment in [  # each signed as the agent of the host it names
        ("h" * 300, grpc.StatusCode.UNAUTHENTICATED, "a host name of 300 characters is over DNS's limit of 253"),
        ("bad name!", grpc.StatusCode.UNAUTHENTICATED, "is not a valid host name"),
    ]:
        with secured(grpc.insecure_channel(address), credentials(host)) as channel:
            with pytest.raises(grpc.RpcError) as info:
                next(iter(pb_grpc.RendezvousStub(channel).AgentSession(pb.AgentHello(host=host, pid=1), timeout=10)))
        assert info.value.code() == code, info.value
        assert fragment in (info.value.details() or "")
    with secured(grpc.insecure_channel(address), credentials("hostX")) as channel:
        with pytest.raises(grpc.RpcError) as info:  # too big for any message of the protocol
            next(iter(pb_grpc.RendezvousStub(channel).AgentSession(pb.AgentHello(host="x" * 3_000_000, pid=1),
                                                                   timeout=10)))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
    status = serve.status()
    assert [h["name"] for h in status["hosts"]] == ["hostX"]  # nothing was recorded
    # The real agent, started with a bad --host, stops at once with the reason (before it dials).
    agent = subprocess.run([sys.executable, "-m", "ringmaster.worker.agent",
                            "--rendezvous", address, "--host", "h" * 300],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert agent.returncode == 2
    assert "--host: a host name of 300 characters is over DNS's limit" in agent.stderr
    assert serve.proc.poll() is None and serve.status()["state"] == "starting"


def test_twenty_hosts_and_max_np_two_start_two_agents(run_job, tmp_path) -> None:
    from harness import discovery_script, elastic_job

    script, _ = discovery_script(tmp_path, {f"host{i}": 1 for i in range(20)})
    job = run_job("--min-np", "1", "--max-np", "2", "--host-discovery-script", script, "--discovery-interval", "0.3",
                  *elastic_job(tmp_path / "log", epochs=1, samples=32))
    status = job.wait_status(lambda s: s["world_size"] == 2, 120, "a ring of two")
    assert sum(1 for h in status["hosts"] if h["agent_pid"]) == 2, status["hosts"]
    assert job.wait(180) == 0, job.output
    assert job.events("agent.connected") and not job.events("agent.connected", host="host2")


def test_a_flood_of_stalled_http_connections_leaves_the_job_its_descriptors(run_job, tmp_path) -> None:
    """1100 connections that never send a request, against a rendezvous limited to 1024 file
    descriptors (soft and hard): the rendezvous keeps its descriptors (connections over the cap
    are closed at once, stalled ones after REQUEST_START_TIMEOUT_S), the job trains on and
    finishes, and the API answers again once the stalled connections are dropped."""
    import resource
    import socket

    from harness import elastic_job, wait_for

    job = run_job("-np", "2", "--discovery-interval", "0.3", *elastic_job(tmp_path / "log", epochs=2, samples=640),
                  preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)))
    job.wait_status(lambda s: s["steps"] >= 5, 120, "training")
    host, port = job.api_url.removeprefix("http://").split(":")
    sockets = []
    try:
        peak = 0
        for attempt in range(1100):
            try:
                sockets.append(socket.create_connection((host, int(port)), timeout=2))
            except OSError:
                pass  # the listen queue is full: refused or timed out, as a small backlog does
            if attempt % 50 == 0:
                peak = max(peak, len(os.listdir(f"/proc/{job.proc.pid}/fd")))
        assert len(sockets) > 500
        assert peak < 400, f"the rendezvous held {peak} descriptors during the flood"

        def answers() -> dict | None:
            try:
                return job.status()
            except OSError:
                return None

        assert wait_for(answers, 30, "the API to answer again")["state"] == "running"
        assert job.wait(240) == 0, job.output
    finally:
        for s in sockets:
            s.close()
    assert "Too many open files" not in job.output
    assert not job.events("host.lost") and not job.events("link.lost") and not job.events("commits.lost")
