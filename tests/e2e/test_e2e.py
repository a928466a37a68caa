"""Whole elastic jobs: `ringmaster run` with emulated hosts, real workers, real Gloo rings.

Hosts are emulated by name (one agent process group each, all on 127.0.0.1); killing an agent's
group is a host dying. Every job and its hosts are killed at teardown by the `run_job` fixture.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from harness import (
    FAST,
    ROOT,
    WORKLOADS,
    discovery_script,
    elastic_job,
    events,
    read_logs,
    scrape,
    wait_for,
    write_hosts,
)
from job_checks import assert_every_sample_once, assert_ranks_agree

pytestmark = pytest.mark.slow


def test_demo_job_trains_to_the_end(run_job) -> None:
    job = run_job("-np", "2", "python", "examples/train.py", "--epochs", "2")
    assert job.wait(180) == 0, job.output
    assert "done: y = " in job.output
    formed = [(e["generation"], e["number"], e["size"], e["hosts"],
               e["cause"]) for e in job.events("generation.formed")]
    assert formed == [(1, 1, 2, {"localhost": 2}, "job start")]
    summary = job.wait_event("job.summary")
    assert summary["success"] is True and summary["resets"] == 0 and summary["generations"] == 1


@pytest.mark.parametrize("victim, survivor", [("hostB", "hostA"), ("hostA",
                                                                   "hostB")], ids=["other-host", "rank-0-host"])
def test_killed_host_finishes_smaller_without_losing_committed_work(run_job, tmp_path, victim, survivor) -> None:
    script, _ = discovery_script(tmp_path, {"hostA": 2, "hostB": 2})
    logs_dir = tmp_path / "log"
    job = run_job("--min-np", "2", "--max-np", "8", "--host-discovery-script", script, *FAST, *elastic_job(logs_dir))
    status = job.wait_status(lambda s: s["world_size"] == 4 and s["steps"] >= 5, 120, "4 workers training")
    assert next(w["host"] for w in status["workers"] if w["rank"] == 0) == "hostA"
    job.kill_host(victim)
    assert job.wait(180) == 0, job.output
    logs = read_logs(logs_dir)
    survivors = [w for w in logs if w.startswith(survivor)]
    assert len(survivors) == 2
    for worker in survivors:
        before = [r["step"] for r in logs[worker] if r["event"] == "commit" and r["generation"] == 1]
        resumed = [r for r in logs[worker] if r["event"] == "synced" and r["generation"] == 2]
        assert resumed, f"{worker} never rejoined:\n{job.output}"
        assert resumed[0]["step"] >= max(before), (
            f"{worker} lost committed steps: last commit {max(before)}, resumed at {resumed[0]['step']}"
        )
        assert resumed[0]["size"] == 2
    done = events(logs, "done")
    assert len(done) == 2 and all(r["size"] == 2 for r in done)
    assert len({r["checksum"] for r in done}) == 1
    assert_every_sample_once(logs, 3)
    assert_ranks_agree(logs)
    assert job.events("host.lost", host=victim) and job.events("host.blacklisted", host=victim, cooldown_s=None)
    assert job.events("state.rolled_back")
    assert job.events("generation.formed", number=2, size=2, hosts={survivor: 2})


@pytest.mark.parametrize("relay", ["auto", "always"], ids=["own-calls", "carried-by-agents"])
def test_scale_up_then_down_follows_discovery(run_job, tmp_path, relay) -> None:
    """A small job's workers ask for each new ring themselves; a large job's agents carry their
    host's `Ready`s together (forced here with --heartbeat-relay always: ready_relay.py). At a
    host update one member reports the commit, and every member is placed or retired unasked."""
    script, hosts = discovery_script(tmp_path, {"hostA": 2})
    logs_dir, stop = tmp_path / "log", tmp_path / "stop"
    # Declared head first: the survivors rebuilt their buckets after their first step; the ring
    # with newcomers agrees on them anew (a layout that differed would leave replicas apart).
    # Trains until told to stop: a job of fixed length could end before a newcomer warmed up on a
    # loaded machine (as the drain test's did beside a CPU hog).
    job = run_job("--min-np", "2", "--max-np", "8", "--host-discovery-script", script, *FAST, "--heartbeat-relay",
                  relay, *elastic_job(logs_dir, epochs=1000, samples=128), "--head-first", "--stop-file", stop,
                  env={"HOROVOD_FUSION_THRESHOLD": "0"})
    job.wait_status(lambda s: s["steps"] >= 3, 120, "training on hostA")
    write_hosts(hosts, {"hostA": 2, "hostB": 2})
    grown = job.wait_status(lambda s: s["world_size"] == 4, 120, "the world to grow to 4")
    assert grown["generation"] == 2, "both newcomers should join in one reset:\n" + job.output
    readies = scrape(job.api_url)
    by_agents, own = (readies.get(("ringmaster_worker_ready_total", (("via", v),)), 0) for v in ("agent", "worker"))
    # At the host update one member reports the commit; the other is placed without asking
    # (`HostsUpdated.placed`), unless its place takes longer than its notice to come.
    if relay == "always":  # (the member that reported answered through its agent at least)
        assert by_agents >= 1 and by_agents + own >= 3, readies
    else:
        assert by_agents == 0 and own >= 3, readies
    hosts.write_text("hostA:2\nhostB:2\nhostC:many\n")
    job.wait_status(lambda s: any("hostC:many" in e for e in s["events"]), 60, "the bad discovery line to be reported")
    steps = job.status()["steps"]
    job.wait_status(lambda s: s["steps"] >= steps + 3 and s["world_size"] == 4, 60, "training to go on at size 4")
    write_hosts(hosts, {"hostB": 2})
    shrunk = job.wait_status(lambda s: s["world_size"] == 2, 120, "the world to shrink to 2")
    assert {w["host"] for w in shrunk["workers"] if w["rank"] is not None} == {"hostB"}
    gone = job.wait_status(lambda s: not next(h for h in s["hosts"] if h["name"] == "hostA")["agent_connected"], 60,
                           "hostA's agent to stop")
    assert not next(h for h in gone["hosts"] if h["name"] == "hostA")["blacklisted"]
    job.wait_status(lambda s: s["steps"] >= gone["steps"] + 3, 60, "training on hostB alone")
    stop.touch()
    assert job.wait(180) == 0, job.output
    logs = read_logs(logs_dir)
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)  # newcomers started from rank 0's parameters
    newcomer_sync = [r for r in events(logs, "synced") if r["worker"].startswith("hostB")]
    assert newcomer_sync and newcomer_sync[0]["step"] > 0
    # the sync event says who got rank 0's commit: the two newcomers (ranks 2, 3), nobody else
    (rank0_joined,) = [e for e in job.events("ring.joined", generation=2) if e["rank"] == 0]
    assert rank0_joined["synced_to"] == [2, 3], rank0_joined
    assert job.events("worker.stopped", worker="hostA/1", host="hostA", exit_code=0, signal=0)  # left by itself
    assert not job.events("state.rolled_back")  # scaling never rolls back
    assert job.events("discovery.failed")
    assert job.events("host.left", host="hostA")


@pytest.mark.parametrize("relay", ["auto", "always"], ids=["own-heartbeats", "relayed-by-agents"])
def test_stopped_worker_is_detected_and_the_ring_recovers(run_job, tmp_path, relay) -> None:
    """A hung worker is found by its silence, whether it calls the rendezvous itself (a small
    job) or its agent carries its heartbeats and its messages (a large job's way: forced here)."""
    script, _ = discovery_script(tmp_path, {"hostA": 2, "hostB": 1})
    logs_dir = tmp_path / "log"
    job = run_job("--min-np", "2", "--host-discovery-script", script, *FAST, "--heartbeat-timeout", "3",
                  "--heartbeat-relay", relay, "--stop-grace", "1", *elastic_job(logs_dir, epochs=4))
    status = job.wait_status(lambda s: s["world_size"] == 3 and s["steps"] >= 3, 120, "3 workers training")
    victim = next(w for w in status["workers"] if w["host"] == "hostB")
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        job.wait_status(lambda s: s["generation"] >= 2 and s["world_size"] == 2, 60,
                        "a ring without the stopped worker")
    finally:
        try:
            os.kill(victim["pid"], signal.SIGCONT)
        except ProcessLookupError:
            pass
    beats = scrape(job.api_url)
    by_agents, own = (beats.get(("ringmaster_worker_heartbeats_total", (("via", v),)), 0) for v in ("agent", "worker"))
    carried, streamed = (beats.get(("ringmaster_worker_messages_total", (("via", v),)), 0) for v in ("agent", "stream"))
    if relay == "always":  # (a worker's first beats may go before its agent heard it should relay)
        assert by_agents > 0 and wait_for(lambda: status_steps_relayed(job), 30, "commits seen through the agents")
        assert carried > 0, beats  # the new ring's assignments came through the agents too (event_relay.py)
    else:
        assert by_agents == 0 and own > 0
        assert carried == 0 and streamed > 0, beats
    assert job.wait(180) == 0, job.output
    failed = job.events("worker.failed", worker=victim["worker_id"], host="hostB")
    assert failed and failed[0]["reason"].startswith("sent no heartbeat"), failed
    assert_every_sample_once(read_logs(logs_dir), 4)


def status_steps_relayed(job) -> bool:
    """The job's commits advance while its workers' own heartbeats stay put: what the status
    says of progress came through the agents."""
    first = scrape(job.api_url)
    steps = job.status()["steps"]
    wait_for(lambda: job.status()["steps"] > steps, 30, "more commits")
    later = scrape(job.api_url)
    own = ("ringmaster_worker_heartbeats_total", (("via", "worker"),))
    return later.get(own, 0) == first.get(own, 0)


def test_below_min_np_fails_after_the_elastic_timeout(run_job, tmp_path) -> None:
    script, _ = discovery_script(tmp_path, {"hostA": 2})
    job = run_job("--min-np", "3", "--host-discovery-script", script, "--elastic-timeout", "2", "--start-timeout", "1",
                  *elastic_job(tmp_path / "log"))
    assert job.wait(120) == 1
    (failed,) = job.events("job.failed")
    assert "needs at least 3 workers (--min-np) but had only 2 for 2 s (--elastic-timeout)" in failed["reason"]


@pytest.mark.parametrize("body, message", [
    ("echo hostA:2\necho hostB:two\n", "line 2: 'hostB:two': slots 'two' is not an integer"),
    ("echo hostA:0\n", "slots must be a positive integer, got 0"),
    ("echo 'no scheduler' >&2; exit 4\n", "exited with code 4: no scheduler"),
])
def test_bad_discovery_script_refuses_to_start(run_job, tmp_path, body, message) -> None:
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    job = run_job("--host-discovery-script", script, "python", "-c", "pass")
    assert job.wait(60) == 2
    assert message in job.output


def test_missing_training_program_fails_with_the_reason(run_job) -> None:
    job = run_job("-np", "2", "no-such-training-program")
    assert job.wait(120) == 1
    (unstartable, *_) = job.events("process.start_failed", worker="localhost/1")
    assert "No such file or directory" in unstartable["error"]
    (failed,) = job.events("job.failed")
    assert "before it reached the rendezvous" in failed["reason"], failed
    assert "No such file or directory: 'no-such-training-program'" in failed["reason"], failed
    assert job.events("worker.exited", exit_code=127)
    assert not job.events("generation.formed", number=2), "a command that cannot start is not restarted"


def test_collectives_on_a_real_ring(run_job, tmp_path) -> None:
    job = run_job("-H", "hostA:2,hostB:1", "python", str(WORKLOADS / "collectives.py"), str(tmp_path))
    assert job.wait(120) == 0, job.output
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(3)]
    for r, result in enumerate(results):
        assert result["rank"] == r and result["size"] == 3
        assert result["average"] == [2.0, 4.0] and result["sum"] == [6.0, 12.0] and result["max"] == [3.0, 6.0]
        assert result["input_untouched"] == [r + 1.0, 2.0 * (r + 1)]
        assert result["half_sum"] == [6.0] and result["bf16_average"] == [2.0]
        assert result["big_ring_used"] and result["big_untouched"], result
        assert result["big_sum_error"] == 0.0 and result["big_average_error"] < 1e-6, result
        assert result["allgather"] == [[0, 0], [1, 1], [1, 1], [2, 2], [2, 2], [2, 2]]
        assert result["broadcast"] == [20.0]
        assert result["object"] == {"from": 0, "text": "hi"}
        assert result["gathered_objects"] == [0, 2, 4]
        # d(sum(w.x))/dw = x = rank+1 per rank; averaged over 3 ranks = 2, lr 1
        assert result["weight_delta"] == [[pytest.approx(2.0)] * 3]
        assert result["accumulated_delta"] == [[pytest.approx(4.0)] * 3]  # two passes summed, then averaged
        # Adasum of parallel vectors is their mean, pairwise up the tree: ((1, 2) -> 1.5, (1.5, 3)) -> 2.25
        assert result["adasum"] == [pytest.approx(2.25), pytest.approx(4.5)]
        assert result["adasum_delta"] == [[pytest.approx(2.25)] * 3]
        # gradients went out in buckets while backward ran, and reduce to the plain average
        buckets = result["buckets"]
        assert buckets["buckets"] >= 4 and buckets["in_flight_after_backward"] >= 2, buckets
        assert buckets["matches_1_none"] and buckets["matches_2_none"] and buckets["unused_grads"] == [0.0, 0.0], (
            buckets
        )
        assert buckets["matches_1_fp16"] and buckets["matches_1_bf16"], buckets
        assert result["grouped"] == [[3.0], [3, 3]]
        order = result["bucket_order"]
        assert all(order[f"matches_{step}"] for step in range(3)), order
        assert order["before"] == ["side.bias", "side.weight", "body.bias", "body.weight", "head.bias", "head.weight"]
        assert order["order_0"] == order["order_1"] == order["order_2"] == results[0]["bucket_order"]["order_0"]
        assert order["order_0"][:2] in (["side.bias", "side.weight"], ["side.weight", "side.bias"]), order  # rank 0's
        assert set(order["order_0"][2:4]) == {"head.bias", "head.weight"}, order
    assert len({result["big_digest"] for result in results}) == 1  # the same bytes on every rank
    assert len({json.dumps(r["weights"]) for r in results}) == 1
    assert len({json.dumps(r["adasum_weights"]) for r in results}) == 1
    # state sync moves only what differs, and leaves every rank with the newest commit (rank 0's
    # unless another rank holds more commits)
    plans = {name: (seen["root"], seen["skeleton_to"], seen["tensors_to"]) for name, seen in results[0]["sync"].items()}
    assert plans == {"all-equal": (0, [], []), "one-newcomer": (0, [2], [2]), "objects-only": (0, [1, 2], []),
                     "all-differ": (0, [1, 2], [1, 2]), "newest-not-rank-0": (1, [0, 2], [0, 2])}
    for name in plans:
        assert len({json.dumps(r["sync"][name], sort_keys=True) for r in results}) == 1, name
    assert results[2]["sync"]["one-newcomer"]["w"] == [0.0, 1.0, 2.0, 3.0]
    assert results[2]["sync"]["objects-only"]["epoch"] == 10
    assert results[1]["sync"]["all-differ"]["w"] == [0.0] * 4
    assert results[1]["sync"]["all-differ"]["optimizer"] == [0]
    assert results[0]["sync"]["newest-not-rank-0"]["w"] == [0.0, 1.0, 2.0, 3.0]  # rank 1's, not rank 0's fives
    assert results[0]["sync"]["newest-not-rank-0"]["epoch"] == 3
    topology = [(r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in results]
    assert topology == [(0, 2, 0, 2), (1, 2, 0, 1), (0, 1, 1, 2)]


def test_horovod_script_runs_alone_without_ringmaster(tmp_path) -> None:
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGMASTER_")}
    proc = subprocess.run([sys.executable, str(WORKLOADS / "collectives.py"), str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "0.json").read_text())
    assert result["size"] == 1 and result["sum"] == [1.0, 2.0] and result["allgather"] == [[0, 0]]


def test_plain_torch_distributed_script_is_restarted_as_a_whole(run_job, tmp_path) -> None:
    marker = tmp_path / "failed-once"
    job = run_job("-np", "3", "--max-restarts", "1", "python", str(WORKLOADS / "plain_ddp.py"), "--fail-once", marker)
    assert job.wait(180) == 0, job.output
    assert marker.exists()
    lines = sorted(line.split("] ", 1)[1] for line in job.lines if "] plain rank" in line)
    assert lines == [f"plain rank {r}/3 local {r}/3 restart 1 sum 3" for r in range(3)]
    assert job.events("generation.formed", number=2, size=3)


def test_serve_and_a_separately_started_agent_run_a_job(run_job, tmp_path) -> None:
    """`ringmaster serve` runs the rendezvous alone; `ringmaster agent` joins it as a real host would."""
    server = run_job("-H", "hostX:2", "--port", "0", "python", str(WORKLOADS / "collectives.py"), str(tmp_path),
                     verb="serve")
    address = server.wait_event("rendezvous.listening")["address"]
    agent = run_job("--rendezvous", address, "--host", "hostX", verb="agent")
    assert server.wait(120) == 0, server.output
    assert agent.wait(30) == 0, agent.output
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["0.json", "1.json"]
    assert server.events("agent.connected", host="hostX")


def test_killed_host_comes_back_after_its_blacklist_cooldown(run_job, tmp_path) -> None:
    script, _ = discovery_script(tmp_path, {"hostA": 2, "hostB": 2})
    logs_dir, stop = tmp_path / "log", tmp_path / "stop"
    # Trains until told to stop: on a loaded machine hostB's newcomers may take longer to warm up
    # than a job of fixed length has left to train.
    job = run_job("--min-np", "2", "--host-discovery-script", script, "--blacklist-cooldown-range", "2", "4", *FAST,
                  *elastic_job(logs_dir, epochs=1000, samples=128), "--stop-file", stop)
    job.wait_status(lambda s: s["world_size"] == 4 and s["steps"] >= 3, 120, "4 workers training")
    job.kill_host("hostB")
    job.wait_status(lambda s: s["world_size"] == 2, 60, "the ring without hostB")
    back = job.wait_status(lambda s: s["world_size"] == 4, 120, "hostB back after its cooldown")
    assert {h["name"]: h["blacklisted"] for h in back["hosts"]} == {"hostA": False, "hostB": False}
    job.wait_status(lambda s: s["steps"] >= back["steps"] + 3, 60, "training at size 4 again")
    stop.touch()
    assert job.wait(240) == 0, job.output
    cooldowns = [e["cooldown_s"] for e in job.events("host.blacklisted", host="hostB")]
    assert cooldowns and 2 <= cooldowns[0] < 3, cooldowns
    logs = read_logs(logs_dir)
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)


def test_ringmaster_scale_shrinks_and_grows_a_running_job(run_job, tmp_path) -> None:
    import subprocess

    logs_dir, stop = tmp_path / "log", tmp_path / "stop"
    # Trains until told to stop: on a loaded machine the newcomers of the scale-up may take longer
    # to warm up than a job of fixed length has left to train.
    job = run_job("--min-np", "1", "--max-np", "4", "-H", "hostA:2,hostB:2", *FAST,
                  *elastic_job(logs_dir, epochs=1000, samples=192), "--stop-file", stop)
    api = job.wait_api()
    job.wait_status(lambda s: s["world_size"] == 4 and s["steps"] >= 3, 120, "4 workers training")

    def scale(n: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ringmaster.cli", "scale", "--api", api, "-np", str(n)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    refused = scale(5)
    assert refused.returncode == 1 and "cannot scale to 5 workers: --max-np is 4" in refused.stderr
    assert scale(2).returncode == 0
    job.wait_status(lambda s: s["world_size"] == 2, 60, "the world to shrink to 2")
    assert scale(4).returncode == 0
    back = job.wait_status(lambda s: s["world_size"] == 4, 120, "the world to grow back to 4")
    job.wait_status(lambda s: s["steps"] >= back["steps"] + 3, 60, "training at size 4 again")
    stop.touch()
    assert job.wait(240) == 0, job.output
    logs = read_logs(logs_dir)
    assert_every_sample_once(logs)
    assert_ranks_agree(logs)
    assert not job.events("state.rolled_back")


@pytest.mark.parametrize("compression, hidden", [("none", 8), ("fp16", 1 << 17)])
def test_a_peer_dying_with_buckets_in_flight_leaves_no_half_reduced_gradients(run_job, tmp_path, compression,
                                                                              hidden) -> None:
    """A worker dies inside backward while its later layers' gradient buckets are already being
    reduced: the survivors' wait fails fast, the step is dropped with its gradients (none is
    left half-reduced for the next optimizer step), and the ring re-forms without its host.
    With fp16 and a wide hidden layer, the buckets in flight are 256 KiB of float16 each: they
    go around the half-precision ring of point-to-point transfers, not Gloo's allreduce."""
    log_dir = tmp_path / "log"
    job = run_job("--min-np", "2", "-H", "hostA:2,hostB:1", *FAST, *elastic_job(log_dir, epochs=2, samples=48),
                  "--die-in-backward-at", "5", "--compression", compression, "--hidden", str(hidden),
                  env={"HOROVOD_FUSION_THRESHOLD": "64"})
    assert job.wait(180) == 0, job.output
    logs = read_logs(log_dir)
    (dying,) = events(logs, "dying")
    assert dying["in_flight"] >= 1 and dying["others_in_backward"], dying  # buckets were out when it died
    assert dying["ring_sum"] == (compression == "fp16"), dying
    resets = events(logs, "reset")
    assert len(resets) == 2 and all(r["grads_cleared"] for r in resets), resets
    assert job.events("worker.exited", exit_code=1) and job.events("generation.formed", number=2, size=2)
    assert_ranks_agree(logs)
    assert_every_sample_once(logs, 2)
