"""The scale harness at a small size (`bench/scale.py`): a real `ringmaster serve` against hosts
simulated by real protocol clients in two processes. What is asserted is correctness, not time:
after the first generation, a host lost, hosts added and half the hosts removed, every worker
that runs holds exactly one assignment of the newest generation, ranks 0..N-1 with each host's
workers together, and the generation numbers go up."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import scale  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("relay", ["auto", "always"], ids=["own-streams", "carried-by-agents"])
def test_the_simulated_hosts_get_consistent_assignments_through_every_change(tmp_path, monkeypatch, relay) -> None:
    """At this size every worker hears its own stream; with `--heartbeat-relay always` (a large
    job's way) the agents carry the host's messages, one per host (event_relay.py)."""
    from harness import scrape

    monkeypatch.setattr(scale, "ADDED_HOSTS", 16)
    cluster = scale.Cluster(tmp_path, hosts=64, slots=4, store="memory", fleets=2, heartbeat_s=1.0, discovery_s=0.3,
                            extra=["--heartbeat-relay", relay])
    cluster.first_timeout_s = cluster.change_timeout_s = 120.0
    try:
        cluster.start()
        first = cluster.wait_settled(64 * 4, 0, 60, "the first generation")
        scale.check_assignments(cluster.assignments(), 64 * 4, first)
        changes = scale.run_changes(cluster)  # (each checked as it is measured)
        assert [c.workers for c in changes] == [63 * 4, 79 * 4, 39 * 4]
        numbers = [first] + [c.generation for c in changes]
        assert numbers == sorted(set(numbers)), numbers
        # The rendezvous stamps when each generation's last assignment left it: after the change,
        # before the last worker held it (both clocks are this machine's).
        assert all(0 < c.out_s <= c.seconds + 0.01 for c in changes), changes
        assert sum(s["refused"] for s in cluster.summaries()) == 0
        metrics = scrape(f"http://127.0.0.1:{cluster.api_port}")
        assert metrics[("ringmaster_assignments_out_seconds_count", ())] >= len(numbers)
        carried = metrics.get(("ringmaster_worker_messages_total", (("via", "agent"),)), 0)
        streamed = metrics.get(("ringmaster_worker_messages_total", (("via", "stream"),)), 0)
        if relay == "always":  # every change's assignments went through the agents
            assert carried >= 64 * 4 + 63 * 4 + 79 * 4 + 39 * 4, metrics
        else:
            assert carried == 0 and streamed >= 64 * 4 + 63 * 4 + 79 * 4 + 39 * 4, metrics
    finally:
        cluster.close()


def test_an_agent_carries_beats_only_of_its_own_hosts_workers_with_a_sane_age(tmp_path) -> None:
    """What an agent relays is input: a beat of another host's worker, or one whose age is
    negative or not a number, is ignored; a good one counts (`ringmaster_worker_heartbeats_total`).
    The job relays nothing itself here (`--heartbeat-relay never`), so the count is the test's."""
    import grpc
    from harness import scrape
    from simulated_hosts import signed

    from ringmaster.common.keys import AGENT, Identity
    from ringmaster.proto import ringmaster_pb2 as pb
    from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc

    cluster = scale.Cluster(tmp_path, hosts=2, slots=2, store="memory", fleets=1, heartbeat_s=1.0, discovery_s=0.3,
                            extra=["--heartbeat-relay", "never"])
    try:
        cluster.start()
        rows = cluster.assignments()
        mine = next(r[0] for r in rows if r[1] == "h00000")
        theirs = next(r[0] for r in rows if r[1] == "h00001")
        url = f"http://127.0.0.1:{cluster.api_port}"
        relayed = ("ringmaster_worker_heartbeats_total", (("via", "agent"),))
        assert scrape(url).get(relayed, 0) == 0

        def relay(*beats: tuple[str, float]) -> None:
            request = pb.AgentHeartbeatRequest(host="h00000", workers=[
                pb.RelayedBeat(beat=pb.WorkerHeartbeatRequest(worker_id=w, commits=1), age_s=age) for w, age in beats])
            with grpc.insecure_channel(f"127.0.0.1:{cluster.port}") as channel:
                answer = pb_grpc.RendezvousStub(channel).AgentHeartbeat(
                    request, metadata=signed("AgentHeartbeat", Identity(AGENT, "h00000"), request), timeout=10)
            assert answer.ok

        relay((theirs, 0.5), (mine, -1.0), (mine, float("nan")), (mine, 1e9), ("h00000/999999", 0.1))
        assert scrape(url).get(relayed, 0) == 0
        relay((mine, 0.5))
        assert scrape(url).get(relayed, 0) == 1
    finally:
        cluster.close()


def test_the_scale_guard_says_regressed_and_fails_past_a_recorded_value(tmp_path) -> None:
    """`bench/scale_guard.py` at a small size, in one run, against recorded values no run can meet
    for half its figures and generous ones for the other half: the first are REGRESSED, the
    others ok, and the run exits 1."""
    import json
    import subprocess

    guard = pathlib.Path(scale.__file__).with_name("scale_guard.py")
    recorded = json.loads(guard.with_suffix(".json").read_text())
    names = list(recorded["figures"])
    strict = set(names[::2])
    figures = {name: {"value": 0.0 if name in strict else 1e9, "relative": 0.0, "absolute": 0.0} for name in names}
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps({**recorded, "hosts": 16, "slots": 2, "figures": figures}))
    run = subprocess.run([sys.executable, str(guard), "--recorded", str(path), "--steady-s", "0.5",
                          "--aftermath-s", "0.5"], capture_output=True, text=True, timeout=600, start_new_session=True)
    assert run.returncode == 1, run.stdout + run.stderr
    verdicts = {line.split()[0]: line.split()[-1] for line in run.stdout.splitlines()
                if line.split()[:1] and line.split()[0] in figures}
    assert verdicts == {name: "REGRESSED" if name in strict else "ok" for name in names}, run.stdout


def test_the_coordinator_alone_takes_every_step_of_the_changes() -> None:
    """`bench/scale.py --part control` at a small size: each step's assertions hold (a host lost,
    64 hosts added through their host update and its report, a rack lost) and each is timed."""
    import gc

    thresholds = gc.get_threshold()
    try:
        costs = scale.control_costs(16, 8)
    finally:  # (the bench keeps the heap as `serve` does: frozen, with its own thresholds)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    assert "the update's commit reported: the next generation" in costs
    assert all(seconds >= 0 for seconds in costs.values()), costs
