"""Ringmaster inside a real Slurm: `sbatch` a job whose `ringmaster run` finds its nodes in the
allocation and starts each node's agent as a job step (`--launcher slurm`, chosen by itself).

The cluster is real (`slurm_cluster.py`): slurmctld, munged, and one slurmd per network
namespace, each node its own address and host name. Faults are real: a node an administrator
marks DOWN, a node whose every process dies (slurmd too), and Slurm's preemption signal
(`scancel --signal=USR1 --batch`, what `#SBATCH --signal=B:USR1@90` sends), after which the job
checkpoints, is requeued by Slurm and resumes. Skipped only where the packages or namespaces
cannot be had; CI installs them and runs as root.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest
from harness import ROOT, SECRET, WORKLOADS, events, free_port, parse_event_line, read_logs, wait_for
from job_checks import assert_every_sample_once, assert_ranks_agree
from slurm_cluster import SlurmCluster, skip_reason

pytestmark = [pytest.mark.slow, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


@pytest.fixture
def slurm(tmp_path):
    """Two Slurm nodes, each a namespace; every daemon stopped and namespace removed at teardown."""
    cluster = SlurmCluster(2, tmp_path).start()
    try:
        yield cluster
    finally:
        cluster.remove()


def batch_script(cluster: SlurmCluster, name: str, run_flags: list[str], epochs: int, samples: int,
                 step_time: float = 0.08, nodes: str = "--nodes=2",
                 workload_flags: tuple[str, ...] = ()) -> pathlib.Path:
    """An sbatch script as a user writes it (examples/slurm/ is the one to copy): `exec` so that
    Slurm's signals reach `ringmaster run` itself."""
    log = cluster.workdir / "log"
    log.mkdir(exist_ok=True)
    script = cluster.workdir / f"{name}.sbatch"
    script.write_text("\n".join([
        "#!/bin/bash",
        f"#SBATCH {nodes} --ntasks-per-node=1 --no-kill --requeue --open-mode=append",
        f"#SBATCH --output={cluster.workdir}/{name}.out --chdir={cluster.workdir}",
        "unset RINGMASTER_LAUNCHER  # (the tests' own default): inside a Slurm job the launcher is slurm by itself",
        f"exec {sys.executable} -m ringmaster.cli run --network-interface {cluster.net.bridge} --min-np 1 "
        f"--discovery-interval 0.5 --log-format json {' '.join(run_flags)} "
        f"{sys.executable} {WORKLOADS / 'elastic_job.py'} --log-dir {log} --epochs {epochs} --samples {samples} "
        f"--step-time {step_time} --timestamps {' '.join(workload_flags)}",
        "",
    ]))
    return script


def job_events(cluster: SlurmCluster, name: str, kind: str | None = None) -> list[dict]:
    path = cluster.workdir / f"{name}.out"
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    found = [parse_event_line(line) for line in lines]
    return [e for e in found if e is not None and (kind is None or e.get("kind") == kind)]


def wait_state(cluster: SlurmCluster, job_id: str, states: set[str], timeout_s: float, name: str) -> str:
    def reached() -> str | None:
        state = cluster.job_state(job_id)
        return state if state in states else None

    try:
        return wait_for(reached, timeout_s, f"Slurm job {job_id} in {states}", interval_s=0.5)
    except AssertionError:
        out = (cluster.workdir / f"{name}.out")
        raise AssertionError(f"job {job_id} is {cluster.job_state(job_id)}:\n"
                             f"{out.read_text()[-6000:] if out.exists() else '(no output)'}{cluster.logs()}") from None


def first_commit(log_dir: pathlib.Path, predicate) -> dict:
    def find() -> dict | None:
        found = [r for r in events(read_logs(log_dir), "commit") if predicate(r)]
        return min(found, key=lambda r: r["time"]) if found else None

    return wait_for(find, 180, "a matching commit", interval_s=0.2)


def test_an_sbatch_job_finds_its_nodes_starts_agents_as_steps_and_finishes(slurm) -> None:
    script = batch_script(slurm, "plain", [], epochs=2, samples=64)
    submitted = time.time()
    job_id = slurm.sbatch(script)
    first = first_commit(slurm.workdir / "log", lambda r: r["size"] == 2)
    assert wait_state(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 240, "plain") == "COMPLETED"
    launching = job_events(slurm, "plain", "agent.launching")
    assert {e["host"] for e in launching} == {"node0", "node1"}
    assert all("Slurm job step" in e["how"] for e in launching)
    listening = job_events(slurm, "plain", "rendezvous.listening")[0]
    assert f"Slurm job {job_id}" in listening["discovery"]
    logs = read_logs(slurm.workdir / "log")
    assert {r["size"] for r in events(logs, "done")} == {2}
    assert_every_sample_once(logs, 2)
    print(f"\n[figure] Slurm submit -> first step on 2 nodes: {first['time'] - submitted:.2f} s")


def test_a_node_marked_down_leaves_the_job_which_goes_on_smaller(slurm) -> None:
    stop = slurm.workdir / "stop"  # trains until told to: the job lasts as long as the test needs it
    script = batch_script(slurm, "down", [], epochs=1000, samples=96, workload_flags=("--stop-file", str(stop)))
    job_id = slurm.sbatch(script)
    log = slurm.workdir / "log"
    first_commit(log, lambda r: r["size"] == 2 and r["step"] >= 5)
    downed = time.time()
    slurm.scontrol("update", "nodename=node1", "state=down", "reason=ringmaster-test")
    after = first_commit(log, lambda r: r["size"] == 1 and r["time"] > downed)
    stop.touch()
    assert wait_state(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 300, "down") == "COMPLETED"
    logs = read_logs(log)
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)
    assert {r["size"] for r in events(logs, "done")} == {1}
    print(f"\n[figure] Slurm node marked DOWN -> first step at the smaller size: {after['time'] - downed:.2f} s")


def test_a_node_that_dies_whole_is_a_lost_host_and_the_job_recovers(slurm) -> None:
    stop = slurm.workdir / "stop"  # trains until told to: the job lasts as long as the test needs it
    script = batch_script(slurm, "dies", [], epochs=1000, samples=96, workload_flags=("--stop-file", str(stop)))
    job_id = slurm.sbatch(script)
    log = slurm.workdir / "log"
    first_commit(log, lambda r: r["size"] == 2 and r["step"] >= 5)
    killed = time.time()
    assert slurm.kill_node("node1") > 0  # slurmd, the agent's step, the workers: the machine is gone
    after = first_commit(log, lambda r: r["size"] == 1 and r["time"] > killed)
    stop.touch()
    assert wait_state(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 300, "dies") == "COMPLETED"
    assert [e for e in job_events(slurm, "dies", "host.lost") if e["host"] == "node1"]
    logs = read_logs(log)
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)
    print(f"\n[figure] Slurm node killed -> first step without it: {after['time'] - killed:.2f} s")


def test_slurms_preemption_signal_checkpoints_requeues_and_the_job_resumes_losing_nothing(slurm) -> None:
    checkpoints = slurm.workdir / "ckpt"
    script = batch_script(slurm, "preempt", ["--checkpoint-dir", str(checkpoints), "--checkpoint-interval", "3600",
                                             "--drain-grace", "60"], epochs=6, samples=160)
    job_id = slurm.sbatch(script)
    log = slurm.workdir / "log"
    first_commit(log, lambda r: r["size"] == 2 and r["step"] >= 6)
    signalled = time.time()
    done = subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm.env, capture_output=True,
                          text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    requeued = wait_for(lambda: next(iter(job_events(slurm, "preempt", "job.requeued")), None), 120, "the requeue")
    assert "requeued" in requeued["how"], requeued
    last_before = max(r["step"] for r in events(read_logs(log), "commit") if r["time"] < requeued["time"])
    assert wait_state(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 300, "preempt") == "COMPLETED"
    assert slurm.job_field(job_id, "Restarts") == "1"
    logs = read_logs(log)
    resumed = [r for r in events(logs, "synced") if r["time"] > requeued["time"]]
    # It resumes at the commit its workers left at (made durable first), at or after the last one logged.
    assert resumed and min(r["step"] for r in resumed) >= last_before, (last_before, resumed[:2])
    after = min(r["time"] for r in events(logs, "commit") if r["time"] > requeued["time"])
    drained = job_events(slurm, "preempt", "host.drained")
    assert {e["host"] for e in drained} == {"node0",
                                            "node1"} and all(e["outcome"] == "commit" for e in drained), drained
    assert_every_sample_once(logs, 6)  # nothing trained twice into the model, nothing skipped, across the requeue
    start = min(r["step"] for r in resumed)  # (the requeued run numbers its generations from 1 again)
    assert len({r["digest"] for r in resumed if r["step"] == start}) == 1, resumed
    assert len({r["digest"] for r in events(logs, "done")}) == 1
    lost = sum(e.get("steps_lost", 0) for e in drained)
    assert lost == 0
    print(f"\n[figure] Slurm USR1 -> checkpoint written and requeued: {requeued['time'] - signalled:.2f} s; -> the "
          f"requeued job's first step: {after - signalled:.2f} s; steps lost: {lost}")


def test_a_second_allocations_agents_join_the_job_and_leave_when_it_is_cancelled(slurm) -> None:
    """Job A runs on node0 with --hosts-from-agents; job B, submitted from examples/slurm/add_nodes.sbatch
    as a user would, runs an agent on node1 that connects to A's rendezvous: A grows to node1 at a
    commit, and when B is cancelled (Slurm's SIGTERM to its steps) node1 drains and A goes on alone."""
    port = free_port()
    stop = slurm.workdir / "stop"  # trains until told to: the job lasts as long as the test needs it
    script = batch_script(slurm, "grow", ["--hosts-from-agents", "--port", str(port)], epochs=1000, samples=96,
                          nodes="--nodes=1 --nodelist=node0", workload_flags=("--stop-file", str(stop)))
    job_a = slurm.sbatch(script)
    log = slurm.workdir / "log"
    first_commit(log, lambda r: r["size"] == 1 and r["step"] >= 3)
    secret = slurm.workdir / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    submitted = time.time()
    job_b = slurm.sbatch(
        ROOT / "examples" / "slurm" / "add_nodes.sbatch",
        "--nodes=1",
        "--nodelist=node1",
        "--ntasks-per-node=1",
        f"--output={slurm.workdir}/more.out",
        f"--export=ALL,RENDEZVOUS={slurm.node('node0').address}:{port},SECRET_FILE={secret},PATH={pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
    )  # (`ringmaster` as installed)
    grown = first_commit(log, lambda r: r["size"] == 2)
    joined = wait_for(lambda: [e for e in job_events(slurm, "grow", "agent.connected") if e["host"] == "node1"], 60,
                      "node1's agent connected")[0]
    assert {r["worker"].split("_")[0] for r in events(read_logs(log), "commit") if r["size"] == 2} == {"node0", "node1"}
    cancelled = time.time()
    done = subprocess.run(["scancel", job_b], env=slurm.env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    after = first_commit(log, lambda r: r["size"] == 1 and r["time"] > cancelled)
    assert wait_state(slurm, job_b, {"CANCELLED", "COMPLETED", "FAILED"}, 60, "more") == "CANCELLED"
    left = [e for e in job_events(slurm, "grow", "host.left") if e["host"] == "node1"]
    assert left and not [e for e in job_events(slurm, "grow", "host.lost") if e["host"] == "node1"], left
    drained = [e for e in job_events(slurm, "grow", "host.drained") if e["host"] == "node1"]
    assert drained and drained[0]["outcome"] == "commit", drained
    stop.touch()
    assert wait_state(slurm, job_a, {"COMPLETED", "FAILED", "CANCELLED"}, 300, "grow") == "COMPLETED"
    logs = read_logs(log)
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)
    print(f"\n[figure] Slurm: second allocation submitted -> its node's first step in the job: "
          f"{grown['time'] - submitted:.2f} s (agent connected -> step: {grown['time'] - joined['time']:.2f} s); "
          f"scancel -> first step without it: {after['time'] - cancelled:.2f} s")


def test_a_pool_in_an_allocation_starts_each_nodes_pool_agent_as_a_step_and_runs_a_job_there(slurm) -> None:
    """`ringmaster pool serve` as an sbatch job: the launcher is slurm by itself, each node's pool
    agent an `srun` step joining the pool over https; a job submitted to the pool runs on both
    nodes, its agents started by the pool agents."""
    import json
    import ssl
    import urllib.request

    from tls_files import make_tls_files

    node0 = slurm.node("node0").address
    tls = make_tls_files(slurm.workdir / "tls", node0)
    port = free_port()
    log = slurm.workdir / "log"
    log.mkdir(exist_ok=True)
    script = slurm.workdir / "pool.sbatch"
    script.write_text("\n".join([
        "#!/bin/bash",
        f"#SBATCH --nodes=2 --ntasks-per-node=1 --no-kill --output={slurm.workdir}/pool.out --chdir={slurm.workdir}",
        "unset RINGMASTER_LAUNCHER  # (the tests' own default): inside a Slurm job the launcher is slurm by itself",
        f"export GLOO_SOCKET_IFNAME={slurm.net.bridge}",
        f"exec {sys.executable} -m ringmaster.cli pool serve -H node0:1,node1:1 --bind {node0} --api-port {port} "
        f"--tls-cert {tls.cert} --tls-key {tls.key} --tls-ca {tls.ca} --checkpoint-root {slurm.workdir}/ckpt "
        "--start-timeout 60 --log-format json",
        "",
    ]))
    job_id = slurm.sbatch(script)
    context = ssl.create_default_context(cafile=str(tls.ca))

    def call(path: str, body: dict | None = None):
        request = urllib.request.Request(f"https://{node0}:{port}{path}",
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Authorization": f"Bearer {SECRET}",
                                                  "Content-Type": "application/json"},
                                         method="POST" if body else "GET")
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return json.load(answer)

    def joined() -> bool:
        try:
            hosts = call("/hosts")
        except OSError:
            return False
        return len(hosts) == 2 and all(h["joined"] for h in hosts)

    try:
        wait_for(joined, 120, "both nodes' pool agents joined", interval_s=0.5)
        job = call("/jobs", {"command": ["python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(log), "--epochs",
                                         "2", "--samples", "64", "--step-time",
                                         "0.02"], "min_np": 2, "max_np": 2})["id"]
        def ended() -> dict | None:
            state = call(f"/jobs/{job}")
            return state if state["state"] in ("succeeded", "failed") else None

        done = wait_for(ended, 240, "the pool's job to end", interval_s=0.5)
        assert done["state"] == "succeeded", done
    finally:
        subprocess.run(["scancel", job_id], env=slurm.env, capture_output=True, timeout=30)
    starting = job_events(slurm, "pool", "pool.host_agent_starting")
    assert {e["host"] for e in starting} == {"node0", "node1"}
    assert all("Slurm job step" in e["how"] for e in starting)
    assert {e["host"] for e in job_events(slurm, "pool", "pool.agent_starts")} == {"node0", "node1"}
    assert_every_sample_once(read_logs(log), 2)
