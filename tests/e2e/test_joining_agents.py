"""Hosts that join by connecting (`--hosts-from-agents`): how Kubernetes, Slurm or any engine
scales a job, by starting and stopping `ringmaster agent` processes. Real `serve`, real agents
(each its own process group: a host), real workers and Gloo rings.
"""

from __future__ import annotations

import signal

import pytest
from harness import FAST, PRODUCT_SPARES, credentials, elastic_job, first_commit_at, read_logs, wait_for
from job_checks import assert_every_sample_once, assert_ranks_agree

pytestmark = pytest.mark.slow


def agent(run_job, address: str, host: str, *args: str):
    return run_job("--rendezvous", address, "--host", host, *args, verb="agent", env=PRODUCT_SPARES)  # warm spares on


def test_agents_that_connect_are_the_hosts_and_leave_by_draining_or_dying(run_job, tmp_path) -> None:
    logs_dir, stop = tmp_path / "log", tmp_path / "stop"  # trains until told to, once the hosts came and went
    server = run_job("--hosts-from-agents", "--min-np", "1", "--max-np", "4", "--api-port", "0", *FAST,
                     *elastic_job(logs_dir, epochs=1000, samples=96), "--timestamps", "--stop-file", stop, verb="serve")
    address = server.wait_event("rendezvous.listening")["address"]
    assert "agents that join by connecting" in server.wait_event("rendezvous.listening")["discovery"]
    a = agent(run_job, address, "hostA", "--slots", "1")
    server.wait_status(lambda s: s["world_size"] == 1 and s["steps"] >= 2, 120, "hostA training alone")

    b = agent(run_job, address, "hostB", "--slots", "2")  # warms its worker template, then says hello
    warm = b.wait_event("agent.warm", 120)
    assert warm["template"] is True and warm["slots"] == 2
    joined = server.wait_event("agent.connected", 60, host="hostB")
    grown = server.wait_event("generation.formed", 120, size=3)
    assert "agents added hostB:2" in grown["cause"]
    forked = b.events("template.forked")
    assert len(forked) == 2 and not b.events("process.start_failed"), b.output  # both first workers started warm
    template = b.events("template.ready")[0]["pid"]
    assert all(e["time"] > warm["time"] for e in forked) and template not in {e["pid"] for e in forked}
    first = wait_for(lambda: first_commit_at(logs_dir, 3), 60, "a step at size 3")
    print(f"\n[figure] hostB connected -> ring of 3 formed: {grown['time'] - joined['time']:.2f} s; -> the first step "
          f"at size 3: {first - joined['time']:.2f} s; agent start -> warm: {warm['took_s']:.2f} s")

    b.proc.send_signal(signal.SIGTERM)  # the engine takes hostB politely: its workers leave at a commit
    assert b.wait(60) == 0, b.output
    left = server.wait_event("host.left", 60, host="hostB")
    shrunk = server.wait_status(lambda s: s["world_size"] == 1, 60, "the ring without hostB")
    assert "hostB" not in {h["name"] for h in shrunk["hosts"] if h["discovered"]}
    assert not server.events("host.lost", host="hostB") and not server.events("host.blacklisted", host="hostB")
    assert left

    c = agent(run_job, address, "hostC", "--slots", "1", "--no-warm-join", "--no-fork-workers")
    server.wait_status(lambda s: s["world_size"] == 2, 120, "hostC joined")
    assert not c.events("agent.warm") and not c.events("template.ready") and not c.events("template.forked")
    wait_for(lambda: first_commit_at(logs_dir, 2, worker_prefix="hostC"), 60, "hostC's worker in the ring")
    c.kill()  # the whole host dies: its agent's process group
    server.wait_event("host.lost", 60, host="hostC")
    server.wait_status(lambda s: s["world_size"] == 1, 60, "the ring without hostC")

    stop.touch()
    assert server.wait(300) == 0, server.output
    assert a.wait(30) == 0, a.output
    logs = read_logs(logs_dir)
    # A ring of 3 that reaches the end of a remainder it does not divide pads its last step, as
    # Horovod's sampler does (hostB may join a few steps before an epoch's end).
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)


def test_an_agent_with_impossible_slots_is_refused_by_its_own_flags(run_job) -> None:
    for slots in ("0", "-2", "5000"):
        refused = run_job("--rendezvous", "127.0.0.1:1", "--host", "hostX", "--slots", slots, verb="agent")
        assert refused.wait(30) == 2
        assert "--slots" in refused.output, refused.output


def test_a_hello_with_too_many_slots_is_refused_by_the_rendezvous(run_job) -> None:
    """The flag's bound is the agent's; the rendezvous refuses a hello past it whoever sends it
    (a raw client with the host's key, as a hostile agent would)."""
    import grpc

    from ringmaster.common.grpc_auth import secured
    from ringmaster.proto import ringmaster_pb2 as pb
    from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc

    server = run_job("--hosts-from-agents", "--min-np", "1", "python", "-c", "pass", verb="serve")
    address = server.wait_event("rendezvous.listening")["address"]
    for slots in (100_000, -1):
        with secured(grpc.insecure_channel(address), credentials("hostX")) as channel:
            session = pb_grpc.RendezvousStub(channel).AgentSession(
                pb.AgentHello(host="hostX", pid=1, incarnation="x", slots=slots), timeout=10)
            with pytest.raises(grpc.RpcError) as refused:
                next(session)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert f"{slots} slots" in (refused.value.details() or "")
    assert not server.events("agent.connected")


def test_an_agent_of_another_version_is_warned_of_and_a_real_one_is_not(run_job) -> None:
    """The hello carries the agent's version: the real agent (this install) meets its own version,
    a hello of another one (a raw client with the host's key, as a host left on an old install
    would send) is warned of with both versions named, and the host is still taken."""
    import grpc

    import ringmaster
    from ringmaster.common.grpc_auth import secured
    from ringmaster.proto import ringmaster_pb2 as pb
    from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc

    server = run_job("--hosts-from-agents", "--min-np", "1", "python", "-c", "import time; time.sleep(60)",
                     verb="serve")
    address = server.wait_event("rendezvous.listening")["address"]
    agent(run_job, address, "hostA", "--slots", "1", "--no-warm-join")
    server.wait_event("agent.connected", 120, host="hostA")
    with secured(grpc.insecure_channel(address), credentials("hostX")) as channel:
        session = pb_grpc.RendezvousStub(channel).AgentSession(
            pb.AgentHello(host="hostX", pid=1, incarnation="x", slots=1, version="0.1.0\x1b[2J"), timeout=30)
        differs = server.wait_event("agent.version_differs", 60)
        session.cancel()
    assert differs["host"] == "hostX" and differs["agent_version"] == "0.1.0[2J"  # (no control characters)
    assert differs["version"] == ringmaster.__version__ and ringmaster.__version__ in differs["message"]
    assert [e["host"] for e in server.events("agent.version_differs")] == ["hostX"]
    assert server.events("agent.connected", host="hostX")


def test_a_standing_agent_waits_idle_until_discovery_lists_its_host(run_job, tmp_path) -> None:
    """A host's agent started ahead (by the host's own service, as Kubernetes or `srun` would),
    under a discovery script: connected and warm, it runs nothing while its host is not listed,
    takes work as soon as discovery lists it (its worker forked from the template it warmed, no
    launch), gives it back when the host leaves the list, and stays connected for the next time."""
    from harness import discovery_script, write_hosts

    logs_dir, stop = tmp_path / "log", tmp_path / "stop"
    script, hosts = discovery_script(tmp_path, {"hostA": 1})
    server = run_job("--host-discovery-script", script, "--min-np", "1", "--max-np", "2", "--api-port", "0", *FAST,
                     *elastic_job(logs_dir, epochs=1000, samples=96), "--timestamps", "--stop-file", stop, verb="serve")
    address = server.wait_event("rendezvous.listening")["address"]
    agent(run_job, address, "hostA", "--slots", "1")
    b = agent(run_job, address, "hostB", "--slots", "1")
    assert b.wait_event("agent.warm", 120)["template"] is True
    server.wait_event("agent.connected", 60, host="hostB")
    server.wait_status(lambda s: s["world_size"] == 1 and s["steps"] >= 5, 120, "hostA training alone")
    assert not b.events("template.forked") and not b.events("process.started")  # listed nowhere: idle
    assert not server.events("generation.formed", size=2)

    listed = server.events("generation.formed")[-1]["time"]
    write_hosts(hosts, {"hostA": 1, "hostB": 1})
    grown = server.wait_event("generation.formed", 120, size=2)
    assert grown["time"] > listed and "hostB" in grown["cause"]
    wait_for(lambda: first_commit_at(logs_dir, 2, worker_prefix="hostB"), 60, "hostB's worker in the ring")
    assert len(b.events("template.forked")) == 1 and not b.events("process.start_failed"), b.output

    write_hosts(hosts, {"hostA": 1})  # the host leaves the list: its worker leaves at a commit, its agent stays
    server.wait_status(lambda s: s["world_size"] == 1, 120, "the ring without hostB")
    assert b.proc.poll() is None and not server.events("host.lost", host="hostB")
    write_hosts(hosts, {"hostA": 1, "hostB": 1})  # and back: the same agent, a second worker forked
    server.wait_status(lambda s: s["world_size"] == 2, 120, "hostB listed again")
    wait_for(lambda: len(b.events("template.forked")) == 2, 60, "hostB's second worker forked")
    assert len(server.events("agent.connected", host="hostB")) == 1

    stop.touch()
    assert server.wait(300) == 0, server.output
    logs = read_logs(logs_dir)
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)
