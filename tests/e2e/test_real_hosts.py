"""Real hosts: each a Linux network namespace with its own address and its own sshd, reached by
`ringmaster run` over ssh as horovodrun reaches machines; the rendezvous in the root namespace.

Faults are real: a host's processes SIGKILLed, its link taken down (a partition), an sshd that
refuses the key. Skipped only where namespaces cannot be made (not root); CI runs as root.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from harness import FAST, discovery_script, elastic_job, events, read_logs, wait_for, write_hosts
from job_checks import assert_every_sample_once
from netns import NetworkHosts, skip_reason

pytestmark = [pytest.mark.slow, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


@pytest.fixture
def net_hosts(tmp_path):
    """Three namespaces with sshd; removed (processes, namespaces, bridge) whatever happens."""
    made: list[NetworkHosts] = []

    def make(count: int = 3) -> NetworkHosts:
        hosts = NetworkHosts(count, tmp_path).start()
        made.append(hosts)
        return hosts

    try:
        yield make
    finally:
        for hosts in made:
            hosts.remove()


def ssh_job(run_job, net: NetworkHosts, hosts: str, *args: object, env: dict[str, str] | None = None):
    return run_job("--launcher", "ssh", "--ssh-identity-file", net.key, "-H", hosts, *args,
                   env={**net.ssh_env(), **(env or {})})


def test_run_over_ssh_trains_to_the_end_on_hosts_with_their_own_network(run_job, net_hosts, tmp_path) -> None:
    net = net_hosts(2)
    a, b = (h.address for h in net.hosts)
    started = time.monotonic()
    job = ssh_job(run_job, net, f"{a}:2,{b}:2", *FAST, *elastic_job(tmp_path / "log", epochs=2, samples=64))
    assert job.wait(240) == 0, job.output
    listening = job.events("rendezvous.listening")[0]["address"]
    assert listening.startswith(f"{net.gateway}:"), listening  # the address the hosts reach, found by a route lookup
    launched = job.events("agent.launching")
    assert {e["host"] for e in launched} == {a, b} and all("over ssh" in e["how"] for e in launched)
    assert {e["host"] for e in job.events("agent.connected")} == {a, b}
    logs = read_logs(tmp_path / "log")
    assert {r["size"] for r in events(logs, "done")} == {4}
    connected = {e["host"]: e["time"] for e in job.events("agent.connected")}
    per_host = [connected[e["host"]] - e["time"] for e in launched]
    print(f"\n[figure] ssh launch to the end of a 2-epoch job on 2 namespace hosts: {time.monotonic() - started:.1f} "
          f"s; ssh start -> agent connected: {', '.join(f'{t:.2f}' for t in per_host)} s")


def test_a_discovery_script_printing_real_hosts_grows_and_shrinks_the_job(run_job, net_hosts, tmp_path) -> None:
    net = net_hosts(3)
    a, b, c = (h.address for h in net.hosts)
    script, hosts_file = discovery_script(tmp_path, {a: 1, b: 1})
    stop = tmp_path / "stop"  # trains until told to (a loaded machine's newcomers may warm up slowly)
    job = run_job("--launcher", "ssh", "--ssh-identity-file", net.key, "--min-np", "2", "--max-np", "3",
                  "--host-discovery-script", script, *FAST, *elastic_job(tmp_path / "log", epochs=1000, samples=96),
                  "--stop-file", stop, env=net.ssh_env())
    job.wait_status(lambda s: s["world_size"] == 2 and s["steps"] >= 3, 180, "a ring of two training")
    write_hosts(hosts_file, {a: 1, b: 1, c: 1})  # a host added
    grown = job.wait_event("generation.formed", 180, size=3)
    assert c in grown["hosts"]
    write_hosts(hosts_file, {a: 1, c: 1})  # a host removed
    shrunk = job.wait_event("generation.formed", 180, number=grown["number"] + 1)
    assert shrunk["size"] == 2 and b not in shrunk["hosts"], shrunk
    without_b = job.wait_status(lambda s: s["world_size"] == 2, 60, "the ring without b")
    job.wait_status(lambda s: s["steps"] >= without_b["steps"] + 3, 60, "training without b")
    stop.touch()
    assert job.wait(300) == 0, job.output
    logs = read_logs(tmp_path / "log")
    assert_every_sample_once(logs)


def test_a_host_killed_over_ssh_leaves_the_job_to_the_others(run_job, net_hosts, tmp_path) -> None:
    net = net_hosts(3)
    a, b, c = (h.address for h in net.hosts)
    job = ssh_job(run_job, net, f"{a}:1,{b}:1,{c}:1", "--min-np", "2", *FAST,
                  *elastic_job(tmp_path / "log", epochs=4, samples=192), "--timestamps")
    job.wait_status(lambda s: s["world_size"] == 3 and s["steps"] >= 5, 180, "a ring of three training")
    killed_at = time.time()
    assert net.hosts[2].kill_all() > 0  # the host dies: its agent and workers, not its sshd
    job.wait_event("generation.formed", 120, number=2)
    assert job.wait(300) == 0, job.output
    logs = read_logs(tmp_path / "log")
    after = [r for r in events(logs, "synced") if r["generation"] >= 2]
    assert after and {r["size"] for r in after} == {2}
    first_commit = min(r["time"] for r in events(logs, "commit") if r["generation"] >= 2)
    print(f"\n[figure] host killed -> first commit after it (namespaces, ssh): {first_commit - killed_at:.2f} s")


def test_an_unreachable_host_is_left_out_naming_the_ssh_error(run_job, net_hosts, tmp_path) -> None:
    net = net_hosts(3)
    a, b, c = (h.address for h in net.hosts)
    net.hosts[2].kill_all(keep_sshd=False)  # nothing listens on c's port 22: ssh is refused
    job = ssh_job(run_job, net, f"{a}:1,{b}:1,{c}:1", "--min-np", "2", *FAST,
                  *elastic_job(tmp_path / "log", epochs=1, samples=32))
    unreachable = job.wait_event("host.unreachable", 120, host=c)
    assert "ssh exited with code 255" in unreachable["reason"] and "Connection refused" in unreachable["reason"]
    assert job.wait(240) == 0, job.output
    assert job.events("host.blacklisted", host=c)
    assert {r["size"] for r in events(read_logs(tmp_path / "log"), "done")} == {2}


def test_a_wrong_key_is_named_and_a_job_without_enough_hosts_fails(run_job, net_hosts, tmp_path) -> None:
    net = net_hosts(1)
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    host = net.hosts[0].address
    job = run_job("--launcher", "ssh", "--ssh-identity-file", wrong, "-H", f"{host}:2", *FAST,
                  *elastic_job(tmp_path / "log", epochs=1, samples=16), env=net.ssh_env())
    assert job.wait(120) == 1, job.output
    unreachable = job.events("host.unreachable", host=host)
    assert unreachable and "Permission denied" in unreachable[0]["reason"], job.output


def test_a_partitioned_host_fences_itself_and_returns_when_the_link_heals(run_job, net_hosts, tmp_path) -> None:
    net = net_hosts(3)
    a, b, c = (h.address for h in net.hosts)
    marker, stop = tmp_path / "log", tmp_path / "stop"  # (trains until told to)
    job = ssh_job(run_job, net, f"{a}:1,{b}:1,{c}:1", "--min-np", "2", *FAST, "--heartbeat-timeout", "3",
                  "--collective-timeout", "5", "--blacklist-cooldown-range", "3", "3",
                  "--reconnect-timeout", "4", *elastic_job(marker, epochs=1000, samples=96), "--timestamps",
                  "--stop-file", stop)
    job.wait_status(lambda s: s["world_size"] == 3 and s["steps"] >= 5, 180, "a ring of three training")
    cut_at = time.time()
    net.hosts[2].link(False)
    job.wait_event("host.lost", 60, host=c)
    job.wait_event("generation.formed", 60, number=2)
    # The cut-off agent hears nothing for its reconnect window and stops its workers (fencing).
    wait_for(lambda: not net.hosts[2].pythons(), 60,
             "the cut-off host's agent and workers to stop by themselves")
    net.hosts[2].link(True)
    back = job.wait_event("generation.formed", 120, number=3)  # back after its cooldown, through a new ssh
    assert back["size"] == 3 and c in back["hosts"], back
    stop.touch()
    assert job.wait(300) == 0, job.output
    logs = read_logs(marker)
    assert {r["size"] for r in events(logs, "synced") if r["generation"] == 2} == {2}
    first_commit = min(r["time"] for r in events(logs, "commit") if r["generation"] == 2)
    print(f"\n[figure] partition -> first commit of the survivors' ring: {first_commit - cut_at:.2f} s")


def test_the_network_interface_flag_and_a_loopback_rendezvous_that_remote_hosts_cannot_dial(
        run_job, net_hosts, tmp_path) -> None:
    net = net_hosts(1)
    host = net.hosts[0].address
    # --network-interface: the rendezvous, its store and the rings use that interface's address.
    job = ssh_job(run_job, net, f"{host}:2", "--network-interface", net.bridge, *FAST,
                  *elastic_job(tmp_path / "log", epochs=1, samples=32))
    assert job.wait(180) == 0, job.output
    assert job.events("rendezvous.listening")[0]["address"].startswith(f"{net.gateway}:")
    # A rendezvous on loopback cannot be dialled from another machine: said, not hung on.
    refused = ssh_job(run_job, net, f"{host}:2", "--bind", "127.0.0.1", *FAST,
                      *elastic_job(tmp_path / "log2", epochs=1, samples=32))
    assert refused.wait(120) == 1, refused.output
    reason = refused.events("host.unreachable", host=host)[0]["reason"]
    assert "another machine cannot dial" in reason and "--network-interface" in reason


def test_a_rendezvous_cut_off_from_every_host_leaves_training_going_on(run_job, net_hosts, tmp_path) -> None:
    net = net_hosts(2)
    a, b = (h.address for h in net.hosts)
    logs_dir, stop = tmp_path / "log", tmp_path / "stop"  # (trains until told to)
    job = ssh_job(run_job, net, f"{a}:1,{b}:1", "--min-np", "2", *FAST, "--heartbeat-timeout", "3",
                  *elastic_job(logs_dir, epochs=1000, samples=96), "--timestamps", "--stop-file", stop)
    job.wait_status(lambda s: s["world_size"] == 2 and s["steps"] >= 5, 180, "a ring of two training")
    net.cut_rendezvous(True)
    cut_at = time.time()
    try:
        job.wait_event("rendezvous.isolated", 60)
        # The workers train on without the rendezvous: commits keep coming in generation 1.
        wait_for(lambda: len([r for r in events(read_logs(logs_dir), "commit") if r["time"] > cut_at + 4]) >= 10, 60,
                 "commits while the rendezvous is cut off")
    finally:
        net.cut_rendezvous(False)
    job.wait_event("rendezvous.rejoined", 60)
    stop.touch()
    assert job.wait(300) == 0, job.output
    assert not job.events("host.lost") and not job.events("generation.formed", number=2), job.output


def test_serve_with_agents_started_by_something_else_on_hosts_with_their_own_network(
        run_job, net_hosts, tmp_path) -> None:
    """`ringmaster serve` in the root namespace and `ringmaster agent` started on each host by
    something other than ringmaster (Kubernetes, Slurm: here `ip netns exec`), as the README's
    multi-machine setup says; an agent with another secret is refused and says so."""
    net = net_hosts(2)
    a, b = (h.address for h in net.hosts)
    # -np 4: training starts once both agents are there (on a loaded machine the second may come
    # seconds after the first, and a job of 1-4 workers would have finished on the first alone)
    server = run_job("--bind", net.gateway, "--port", "0", "-np", "4", "-H", f"{a}:2,{b}:2", *FAST,
                     *elastic_job(tmp_path / "log", epochs=2, samples=64), verb="serve")
    address = server.wait_event("rendezvous.listening")["address"]
    assert address.startswith(f"{net.gateway}:"), address
    on = {h.address: ["ip", "netns", "exec", h.netns] for h in net.hosts}
    stranger = run_job("--rendezvous", address, "--host", a, verb="agent", prefix=on[a],
                       env={"RINGMASTER_SECRET": "another-job-secret-0123456789"})
    assert stranger.wait(60) != 0, stranger.output
    assert "start the agent with the job's secret" in stranger.output, stranger.output
    server.wait_event("rendezvous.call_refused", 30)
    agents = [run_job("--rendezvous", address, "--host", host, verb="agent", prefix=on[host]) for host in (a, b)]
    assert server.wait(240) == 0, server.output
    for agent in agents:
        assert agent.wait(60) == 0, agent.output
    assert {e["host"] for e in server.events("agent.connected")} == {a, b}
    assert {r["size"] for r in events(read_logs(tmp_path / "log"), "done")} == {4}


def test_a_pool_starts_a_pool_agent_on_each_host_over_ssh_and_runs_a_job_there_over_tls(run_job, net_hosts,
                                                                                         tmp_path) -> None:
    """`pool serve --launcher ssh`: each named host's pool agent started over ssh (its key and the
    pool's CA on its stdin), joining the pool's API over https; a job placed on both hosts runs
    with its rendezvous over TLS, its agents started by the pool agents."""
    import json
    import ssl
    import urllib.request

    from harness import SECRET, WORKLOADS
    from tls_files import make_tls_files

    net = net_hosts(2)
    a, b = (h.address for h in net.hosts)
    tls = make_tls_files(tmp_path / "tls", net.gateway)
    pool = run_job("serve", "--launcher", "ssh", "--ssh-identity-file", net.key, "-H", f"{a}:1,{b}:1",
                   "--bind", net.gateway, "--api-port", "0", "--tls-cert", tls.cert, "--tls-key", tls.key,
                   "--tls-ca", tls.ca, "--checkpoint-root", tmp_path / "ckpt", "--start-timeout", "60",
                   verb="pool", env=net.ssh_env())
    url = str(pool.wait_event("pool.listening", 60)["url"])
    assert url.startswith(f"https://{net.gateway}:"), url
    context = ssl.create_default_context(cafile=str(tls.ca))

    def call(path: str, body: dict | None = None):
        request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Authorization": f"Bearer {SECRET}",
                                                  "Content-Type": "application/json"},
                                         method="POST" if body is not None else "GET")
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return json.load(answer)

    wait_for(lambda: all(h["joined"] for h in call("/hosts")) and len(call("/hosts")) == 2, 120,
             "both pool agents joined")
    (tmp_path / "log").mkdir()
    job = call("/jobs", {"command": ["python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(tmp_path / "log"),
                                     "--epochs", "2", "--samples", "64", "--step-time", "0.02"],
                         "min_np": 2, "max_np": 2})["id"]
    def ended() -> dict | None:
        state = call(f"/jobs/{job}")
        return state if state["state"] in ("succeeded", "failed") else None

    done = wait_for(ended, 240, "the job to end", interval_s=0.5)
    assert done["state"] == "succeeded", (done, pool.output[-4000:])
    assert done["sizes"][0][1] == 2
    starting = pool.events("pool.host_agent_starting")
    assert {e["host"] for e in starting} == {a, b} and all("over ssh" in e["how"] for e in starting)
    assert {e["host"] for e in pool.events("pool.agent_starts")} == {a, b}  # the jobs' agents, from the pool agents
    assert_every_sample_once(read_logs(tmp_path / "log"), 2)
