"""A rendezvous with no single point of failure, end to end: real etcd, real `serve` and `agent`
processes (emulated hosts), real workers training on a Gloo ring.

Each test starts its own etcd on free loopback ports (some kill it); the rendezvous processes,
agents and workers are all killed at teardown by the `run_job` fixture.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import time

import pytest
from etcd_server import EtcdServer
from harness import Job, elastic_job, events, free_port, read_logs, wait_for
from job_checks import assert_every_sample_once

from ringmaster.rendezvous.state.etcd_kv import EtcdStore
from ringmaster.rendezvous.state.job_record import FORMAT

pytestmark = pytest.mark.slow
FAST = ["--discovery-interval", "0.3", "--warmup-grace", "10", "--start-timeout", "20", "--heartbeat-timeout", "4"]


def store_url(etcd: EtcdServer, prefix: str) -> str:
    return f"etcd://{etcd.address}/{prefix}"


def keys(etcd: EtcdServer, prefix: str) -> dict[str, dict]:
    async def read():
        store = await EtcdStore.connect([etcd.endpoint])
        try:
            entries, _ = await store.get_prefix(prefix)
            return {e.key.removeprefix(prefix): e.value for e in entries}
        finally:
            await store.close()
    return asyncio.run(read())


def commits(log_dir: pathlib.Path) -> int:
    return len(events(read_logs(log_dir), "commit"))


def kill(job: Job) -> None:
    os.killpg(job.proc.pid, signal.SIGKILL)
    job.proc.wait()


def started_workers(*agents: Job) -> int:
    return sum(line.count("starting worker") for a in agents for line in a.lines)


def test_training_survives_sigkill_and_restart_of_the_rendezvous(run_job, own_etcd, tmp_path) -> None:
    port = free_port()
    serve = ["-H", "hostA:1,hostB:1", "--port", str(port), "--store", store_url(own_etcd, "jobs/restart"), *FAST,
             *elastic_job(tmp_path / "log", epochs=3, samples=96)]
    first = run_job(*serve, verb="serve")
    first.wait_event("rendezvous.listening")
    agents = [run_job("--rendezvous", f"127.0.0.1:{port}", "--host", h, verb="agent") for h in ("hostA", "hostB")]
    wait_for(lambda: commits(tmp_path / "log") >= 10, 120, "training to commit steps")
    kill(first)
    down = commits(tmp_path / "log")
    # While no rendezvous runs, training goes on: the ring does not need it.
    wait_for(lambda: commits(tmp_path / "log") >= down + 10, 60, "commits while the rendezvous is down")
    second = run_job(*serve, verb="serve")
    second.wait_event("job.resumed", number=1)
    assert second.wait(240) == 0, second.output
    print(first.output, second.output, *(a.output for a in agents), sep="\n")  # shown if a check below fails
    logs = read_logs(tmp_path / "log")
    assert_every_sample_once(logs, 3)
    assert started_workers(*agents) == 2, "a worker was restarted"
    assert {r["generation"] for r in events(logs, "synced")} == {1}  # no reset, no rollback: no step lost
    # The same agent processes came back to the new rendezvous, which had read the job from the
    # store before it served anyone: each is told as reconnected.
    (first_pid,) = {e["pid"] for e in first.events("agent.connected", host="hostA")}
    back = second.events("agent.reconnected", host="hostA")
    assert back and {e["pid"] for e in back} == {first_pid}, back
    assert not second.events("agent.connected", host="hostA"), second.events("agent.connected", host="hostA")
    assert keys(own_etcd, "/jobs/restart/state/") == {}  # a finished job leaves no keys


def test_a_standby_takes_over_when_the_leader_dies(run_job, own_etcd, tmp_path) -> None:
    ports = [free_port(), free_port()]
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    common = ["-H", "hostA:1,hostB:1", "--store", store_url(own_etcd, "jobs/ha"), *FAST,
              *elastic_job(tmp_path / "log", epochs=3, samples=96)]
    leader = run_job("--port", str(ports[0]), *common, verb="serve")
    leader.wait_event("rendezvous.listening")
    standby = run_job("--port", str(ports[1]), *common, verb="serve")
    standby.wait_event("leader.standing_by")
    agents = [run_job("--rendezvous", addresses, "--host", h, verb="agent") for h in ("hostA", "hostB")]
    wait_for(lambda: commits(tmp_path / "log") >= 10, 120, "training to commit steps")
    assert keys(own_etcd, "/jobs/ha/")["leader"]["address"] == f"127.0.0.1:{ports[0]}"
    killed = time.monotonic()
    kill(leader)
    standby.wait_event("rendezvous.listening", 30, address=f"127.0.0.1:{ports[1]}")
    took_over = time.monotonic() - killed
    assert took_over < 10, f"the standby took {took_over:.1f} s to take over"
    assert standby.wait(240) == 0, standby.output
    logs = read_logs(tmp_path / "log")
    assert_every_sample_once(logs, 3)
    # Nobody reconnected to a standby that had not read the job yet (a worker told it is not part
    # of the job leaves it, and its host starts another).
    assert not [e for a in agents for e in a.events("worker.leaving")], [a.output for a in agents]
    assert started_workers(*agents) == 2, "a worker was restarted"
    assert {r["generation"] for r in events(logs, "synced")} == {1}


def test_training_goes_on_while_etcd_is_down_and_the_rendezvous_catches_up(run_job, own_etcd, tmp_path) -> None:
    job = run_job("-np", "2", "--store", store_url(own_etcd, "jobs/etcd-down"), *FAST,
                  *elastic_job(tmp_path / "log", epochs=4, samples=96))
    wait_for(lambda: commits(tmp_path / "log") >= 10, 120, "training to commit steps")
    own_etcd.kill()
    job.wait_event("store.degraded", 30)
    down = commits(tmp_path / "log")
    wait_for(lambda: commits(tmp_path / "log") >= down + 10, 60, "commits while etcd is down")
    own_etcd.start()  # same data folder and ports: etcd comes back with its state
    job.wait_event("store.recovered", 60)
    assert job.wait(240) == 0, job.output
    assert_every_sample_once(read_logs(tmp_path / "log"), 4)


def test_an_agent_that_stops_heartbeating_loses_its_lease_and_its_host(run_job, own_etcd, tmp_path) -> None:
    port = free_port()
    serve = run_job("-H", "hostA:1,hostB:1,hostC:1", "--min-np", "2", "--port", str(port),
                    "--store", store_url(own_etcd, "jobs/lease"), *FAST,
                    *elastic_job(tmp_path / "log", epochs=6, samples=96), verb="serve")
    serve.wait_event("rendezvous.listening")
    agents = {h: run_job("--rendezvous", f"127.0.0.1:{port}", "--host", h,
                         verb="agent") for h in ("hostA", "hostB", "hostC")}
    wait_for(lambda: commits(tmp_path / "log") >= 10, 120, "training to commit steps")
    assert set(keys(own_etcd, "/jobs/lease/agents/")) == {"hostA", "hostB", "hostC"}
    os.kill(agents["hostC"].proc.pid, signal.SIGSTOP)  # alive but silent: its connection stays open
    try:
        wait_for(lambda: "hostC" not in keys(own_etcd, "/jobs/lease/agents/"), 30, "hostC's lease to expire in etcd")
        serve.wait_event("host.lost", 30, host="hostC")
    finally:
        os.kill(agents["hostC"].proc.pid, signal.SIGCONT)
    assert serve.wait(240) == 0, serve.output
    logs = read_logs(tmp_path / "log")
    assert_every_sample_once(logs, 6)
    assert {r["size"] for r in events(logs, "done")} == {2}


def test_two_jobs_on_one_etcd_are_kept_apart_by_their_prefixes(run_job, own_etcd, tmp_path) -> None:
    # Job one trains until told to stop: on a loaded machine a job of fixed length could end while
    # the intruder starts (seen with three tests at a time), and its prefix would then be free.
    stop = tmp_path / "stop"
    jobs = {name: run_job("-np", "2", "--store", store_url(own_etcd, f"team/{name}"), *FAST,
                          *elastic_job(tmp_path / name, epochs=1000 if name == "one" else 2, samples=192),
                          *(["--stop-file", str(stop)] if name == "one" else []))
            for name in ("one", "two")}
    for name in jobs:
        wait_for(lambda: commits(tmp_path / name) >= 4, 120, f"job {name} to train")
    one, two = keys(own_etcd, "/team/one/"), keys(own_etcd, "/team/two/")
    assert one["leader"]["address"] != two["leader"]["address"]
    assert all(v["host"] == "localhost" for k, v in one.items() if k.startswith("state/workers/"))
    # A third `run` on a prefix in use is refused, naming the leader (long before job one ends).
    assert jobs["one"].proc.poll() is None, "job one ended before the intruder came: " + jobs["one"].output
    intruder = run_job("-np", "1", "--store", store_url(own_etcd, "team/one"), "python", "-c", "pass")
    assert intruder.wait(60) == 2
    assert f"led by the rendezvous at {one['leader']['address']}" in intruder.output
    stop.touch()
    for name, job in jobs.items():
        assert job.wait(240) == 0, job.output
        assert_every_sample_once(read_logs(tmp_path / name), None if name == "one" else 2)


def test_unreachable_etcd_is_named_and_an_incompatible_store_refused(run_job, own_etcd, tmp_path) -> None:
    dead = free_port()
    job = run_job("-np", "1", "--store", f"etcd://127.0.0.1:{dead}/x", "python", "-c", "pass")
    assert job.wait(60) == 2
    assert f"127.0.0.1:{dead}" in job.output and "cannot reach the store" in job.output

    async def plant():
        store = await EtcdStore.connect([own_etcd.endpoint])
        await store.put("/old/state/job", {"format": FORMAT, "version": 99})
        await store.close()
    asyncio.run(plant())
    job = run_job("-np", "1", "--store", store_url(own_etcd, "old"), "python", "-c", "pass")
    assert job.wait(60) == 2
    assert "version 99; this ringmaster reads" in job.output
    assert keys(own_etcd, "/old/state/") == {"job": {"format": FORMAT, "version": 99}}  # left as it was
