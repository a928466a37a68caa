"""Bad input at a running rendezvous: it is refused with a message naming it, and the job's
state is untouched. A real `ringmaster serve`, real gRPC calls and a real agent process."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from harness import ROOT, WORKLOADS
from proto import ringmaster_pb2 as pb
from proto import ringmaster_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow


def test_agent_hellos_with_bad_host_names_are_refused(run_job, tmp_path) -> None:
    serve = run_job("-H", "hostX:1", "--start-timeout", "60", "python", str(WORKLOADS / "collectives.py"), str(tmp_path),
                    verb="serve")
    address = serve.wait_line("rendezvous listening on ").split(";")[0]
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.RendezvousStub(channel)
    try:
        for host, code, fragment in [
            ("h" * 300, grpc.StatusCode.INVALID_ARGUMENT, "a host name of 300 characters is over DNS's limit of 253"),
            ("bad name!", grpc.StatusCode.INVALID_ARGUMENT, "is not a valid host name"),
            ("x" * 3_000_000, grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
        ]:
            with pytest.raises(grpc.RpcError) as info:
                next(iter(stub.AgentSession(pb.AgentHello(host=host, pid=1), timeout=10)))
            assert info.value.code() == code, info.value
            assert fragment in (info.value.details() or "")
    finally:
        channel.close()
    status = serve.status()
    assert [h["name"] for h in status["hosts"]] == ["hostX"]  # nothing was recorded
    # The real agent, started with a bad --host, stops at once with the reason.
    agent = subprocess.run([sys.executable, "-m", "worker.agent", "--rendezvous", address, "--host", "h" * 300],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert agent.returncode == 2
    assert "refused this agent: agent hello refused: a host name of 300 characters" in agent.stderr
    assert serve.proc.poll() is None and serve.status()["state"] == "starting"


def test_twenty_hosts_and_max_np_two_start_two_agents(run_job, tmp_path) -> None:
    from harness import discovery_script
    from test_e2e import elastic_job

    script, _ = discovery_script(tmp_path, {f"host{i}": 1 for i in range(20)})
    job = run_job("--min-np", "1", "--max-np", "2", "--host-discovery-script", script, "--discovery-interval", "0.3",
                  *elastic_job(tmp_path / "log", epochs=1, samples=32))
    status = job.wait_status(lambda s: s["world_size"] == 2, 120, "a ring of two")
    assert sum(1 for h in status["hosts"] if h["agent_pid"]) == 2, status["hosts"]
    assert job.wait(180) == 0, job.output
    assert job.output.count("ringmaster-agent[") and "agent for host host2 connected" not in job.output
