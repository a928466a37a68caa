"""GET /metrics: the job's figures in Prometheus' text format, parsed back with prometheus_client."""

from __future__ import annotations

from coordinator_rig import Rig, api_for
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from ringmaster.common.events import Event, Kind
from ringmaster.common.figures import SECONDS_BUCKETS, WorkerFigures, check_stats
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.server.metrics import JobMetrics


def scrape(client: TestClient) -> dict[tuple[str, tuple], float]:
    reply = client.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_follow_the_job_through_a_failure_and_the_workers_figures() -> None:
    rig = Rig(min_np=1, max_np=8)
    metrics = JobMetrics(lambda: rig.coordinator.view(rig.now), refused_calls=lambda: 3, address="10.0.0.1:29400")
    rig.coordinator.job.on_event = metrics.on_event  # (the app chains logging and metrics the same way)
    ids = rig.start_elastic({"a": 1, "b": 1, "c": 1})
    client = TestClient(api_for(rig.coordinator, clock=lambda: rig.now, metrics=metrics))
    m = scrape(client)
    assert m[("ringmaster_generation", ())] == 1 and m[("ringmaster_world_size", ())] == 3
    assert m[("ringmaster_hosts", (("state", "active"),))] == 3 and m[("ringmaster_target_workers", ())] == 8
    assert m[("ringmaster_resets_total", (("cause", "failure"),))] == 0
    assert m[("ringmaster_refused_calls_total", ())] == 3
    assert m[("ringmaster_leader_info", (("address", "10.0.0.1:29400"),))] == 1

    figures = WorkerFigures()
    figures.commit(0.003)
    figures.commit(0.2)
    figures.report(0.75)
    stats = figures.stats()
    assert check_stats(stats) == ""
    metrics.figures.update(ids[0], stats)
    metrics.figures.update(ids[1], stats)
    rig.worker_heartbeat(ids[0], 5, True)
    rig.now = 10.0
    rig.agent_disconnected("c")
    rig.worker_ready(ids[0], 1, "allreduce failed", True)
    rig.worker_ready(ids[1], 1, "allreduce failed", True)
    rig.now = 10.4
    rig.worker_heartbeat(ids[0], 6, True)
    m = scrape(client)
    assert m[("ringmaster_generation", ())] == 2 and m[("ringmaster_world_size", ())] == 2
    assert m[("ringmaster_resets_total", (("cause", "host_lost"),))] == 1
    assert m[("ringmaster_hosts", (("state", "blacklisted"),))] == 1
    assert m[("ringmaster_recovery_seconds_count",
              ())] == 1 and abs(m[("ringmaster_recovery_seconds_sum", ())] - 0.4) < 1e-9
    assert m[("ringmaster_commits_total", ())] == 4
    assert m[("ringmaster_commit_seconds_bucket", (("le", "0.005"),))] == 2  # cumulative buckets
    assert m[("ringmaster_commit_seconds_bucket", (("le", "+Inf"),))] == 4
    assert m[("ringmaster_loss", ())] == 0.75
    metrics.on_event(Event(Kind.WORKER_EXITED, {"worker": ids[1]}))  # its process is gone: what it did stays counted
    assert scrape(client)[("ringmaster_commits_total", ())] == 4
    rig.now = 12.0
    rig.worker_heartbeat(ids[0], 10, True)
    scrape(client)
    rig.now = 14.0
    rig.worker_heartbeat(ids[0], 20, True)
    assert scrape(client)[("ringmaster_steps_per_second", ())] > 0


def test_worker_figures_of_another_shape_are_refused() -> None:
    good = WorkerFigures().stats()
    assert check_stats(good) == ""
    assert "buckets" in check_stats(pb.WorkerStats(commits=pb.Timing(count=1, buckets=[1, 2])))
    assert "negative" in check_stats(pb.WorkerStats(syncs=pb.Timing(count=1, seconds=-1.0)))
    assert "out of range" in check_stats(pb.WorkerStats(rollbacks=-5))
    assert "not finite" in check_stats(pb.WorkerStats(has_loss=True, loss=float("nan")))
    assert len(good.commits.buckets) == len(SECONDS_BUCKETS) + 1


def test_a_declared_global_batch_out_of_range_is_refused_and_a_good_one_is_read_back() -> None:
    figures = WorkerFigures()
    figures.global_batch(24, 3, 3)
    stats = figures.stats()
    assert check_stats(stats) == "" and (stats.global_batch, stats.micro_batch, stats.accumulation,
                                         stats.sharing) == (24, 3, 3, 1)
    for size, micro, share, sharing in ((24, 5, 1, 1),  # not whole micro-batches
                                        (24, 3, 9, 1),  # more than the step's 8
                                        (24, 0, 0, 1), (-24, 3, 0, 1), (24, 3, 1, 0), (0, 0, 2, 0)):
        bad = pb.WorkerStats(global_batch=size, micro_batch=micro, accumulation=share, sharing=sharing)
        assert "global batch" in check_stats(bad), (size, micro, share, sharing)
