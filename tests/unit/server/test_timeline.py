"""The timeline: a worker's span recorder, the trace built from a real coordinator's events
through a failure, and the rotating trace file (read back as JSON)."""

from __future__ import annotations

import json

import pytest
from coordinator_rig import Rig

from ringmaster.cli.main import UsageError, timeline_path
from ringmaster.common.events import Event, Kind
from ringmaster.common.spans import MAX_SPANS_PER_HEARTBEAT, SpanRecorder, check_span
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.server.timeline import FAILURES_TID, RANKS_PID, RENDEZVOUS_PID, TraceBuilder
from ringmaster.rendezvous.server.trace_file import JobTimeline, TraceFile


def test_a_recorder_that_is_off_records_nothing() -> None:
    spans = SpanRecorder(on=False)
    spans.add(pb.SPAN_COMMIT, 1, 2)
    with spans.span(pb.SPAN_SYNC):
        pass
    assert spans.pending() == 0 and spans.take() == []


def test_the_recorder_is_bounded_and_gives_back_what_a_failed_heartbeat_took() -> None:
    spans = SpanRecorder(on=True, capacity=10)
    spans.place = (3, 7)
    for i in range(12):
        spans.add(pb.SPAN_ALLREDUCE, 1000 + i, 1005 + i, detail=i)
    assert spans.pending() == 10 and spans.dropped == 2  # the newest were dropped, counted
    taken = spans.take(4)
    assert [t[5] for t in taken] == [0, 1, 2, 3] and taken[0] == (pb.SPAN_ALLREDUCE, 1000, 5, 3, 7, 0)
    spans.add(pb.SPAN_COMMIT, 2000, 2001)
    spans.give_back(taken)  # the heartbeat failed: they go back in front, in order, as many as fit
    assert [t[5] for t in spans.take()][:5] == [0, 1, 2, 4, 5] and spans.dropped == 3 and spans.pending() == 0
    with pytest.raises(RuntimeError), spans.span(pb.SPAN_RESTORE):
        raise RuntimeError("a span is told even when its block raises")
    assert spans.take()[0][0] == pb.SPAN_RESTORE


def test_spans_no_worker_would_send_are_refused() -> None:
    good = pb.Span(kind=pb.SPAN_COMMIT, start_us=1_795_000_000_000_000, duration_us=5, rank=1, generation=2)
    assert check_span(good) == ""
    assert "kind" in check_span(pb.Span(kind=pb.SpanKind.ValueType(99), start_us=1, duration_us=1))
    assert "start" in check_span(pb.Span(kind=pb.SPAN_COMMIT, start_us=-5))
    assert "duration" in check_span(pb.Span(kind=pb.SPAN_COMMIT, start_us=1, duration_us=-1))
    assert "rank" in check_span(pb.Span(kind=pb.SPAN_COMMIT, start_us=1, rank=-1))
    assert MAX_SPANS_PER_HEARTBEAT * 64 < 1 << 20  # a full heartbeat stays far below the 1 MiB message limit


def _rig_with_trace() -> tuple[Rig, TraceBuilder, list[dict], list[int]]:
    rig = Rig(min_np=1, max_np=8)
    builder = TraceBuilder(lambda: [(m.worker_id, m.host) for m in rig.coordinator.generation.members]
                           if rig.coordinator.generation else [])
    trace: list[dict] = []
    clock = [1_000_000]

    def on_event(event: Event) -> None:
        trace.extend(builder.on_event(event, clock[0]))

    rig.coordinator.job.on_event = on_event  # (the server chains logging, metrics and the timeline the same way)
    return rig, builder, trace, clock


def test_the_trace_of_a_job_with_one_failure_has_generations_failure_and_arrows_to_each_survivors_recovery() -> None:
    rig, builder, trace, clock = _rig_with_trace()
    ids = rig.start_elastic({"a": 1, "b": 1, "c": 1})
    for rank, wid in enumerate(ids):
        trace += builder.on_spans(wid,
                                  [pb.Span(kind=pb.SPAN_FORWARD, start_us=1_100_000, duration_us=50, rank=rank,
                                           generation=1),
                                        pb.Span(kind=pb.SPAN_ALLREDUCE, start_us=1_100_060, duration_us=20, rank=rank,
                                                generation=1, detail=1)])
    clock[0] = 2_000_000
    rig.now = 10.0
    rig.worker_exited("c", ids[2], 1, 0, False)  # worker c/... dies: the generation ends
    clock[0] = 2_100_000
    rig.worker_ready(ids[0], 1, "allreduce failed", True)
    rig.worker_ready(ids[1], 1, "allreduce failed", True)
    # Survivors tell their recovery: a restore (begun before the rendezvous saw the failure: the
    # arrow still lands on it), then the wait and the ring build.
    trace += builder.on_spans(ids[0],
                              [pb.Span(kind=pb.SPAN_RESTORE, start_us=1_999_000, duration_us=2000, rank=0,
                                       generation=1),
                                       pb.Span(kind=pb.SPAN_WAITING, start_us=2_001_000, duration_us=90_000, rank=0,
                                               generation=2)])
    trace += builder.on_spans(ids[1],
                              [pb.Span(kind=pb.SPAN_WAITING, start_us=2_002_000, duration_us=90_000, rank=1,
                                       generation=2),
                                       pb.Span(kind=pb.SPAN_RING_BUILD, start_us=2_092_000, duration_us=3000, rank=1,
                                               generation=2)])
    trace += builder.close(3_000_000)

    generations = [
        e for e in trace if e["ph"] == "X" and e["pid"] == RENDEZVOUS_PID and e["name"].startswith("generation")
    ]
    assert [g["name"] for g in generations] == ["generation 1", "generation 2"]
    # (the survivors were placed in generation 2 at the failure, before their Ready came)
    assert generations[0]["ts"] == 1_000_000 and generations[0]["dur"] == 1_000_000
    assert "failure" in generations[1]["args"]["causes"]
    failures = [e for e in trace if e["ph"] == "X" and e["tid"] == FAILURES_TID and e["pid"] == RENDEZVOUS_PID]
    assert len(failures) == 1 and failures[0]["name"] == f"{ids[2]} failed" and failures[0]["ts"] == 2_000_000
    starts = {e["id"]: e for e in trace if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace if e["ph"] == "f"}
    assert len(starts) == 2 and starts.keys() == ends.keys()  # one arrow per survivor, none to the dead worker
    assert all(s["ts"] == 2_000_000 and s["tid"] == FAILURES_TID for s in starts.values())
    landed = sorted((e["tid"], e["ts"]) for e in ends.values())
    assert landed == [(0, 2_000_000), (1, 2_002_000)]  # inside rank 0's restore, at rank 1's wait
    assert all(e["pid"] == RANKS_PID and e["bp"] == "e" for e in ends.values())
    names = {e["args"]["name"] for e in builder.metadata() if e["name"] == "thread_name"}
    assert {"generations", "hosts", "failures", "rank 0", "rank 1", "rank 2"} <= names
    bucket = next(e for e in trace if e.get("name") == "allreduce")
    assert bucket["args"] == {"bucket": 1} and bucket["cat"] == "step" and bucket["dur"] == 20


def test_a_lost_host_gets_no_arrows_and_a_second_failure_in_the_same_generation_adds_none() -> None:
    rig, builder, trace, clock = _rig_with_trace()
    ids = rig.start_elastic({"a": 1, "b": 2})
    rig.now = 5.0
    rig.agent_disconnected("b")  # both of b's workers fail with it
    failed = [e for e in trace if e["ph"] == "X" and e.get("cat") == "failure"]
    assert len(failed) == 2
    assert any(e["ph"] == "i" and e["name"] == "b: lost" for e in trace)
    assert ids[0] in builder._flows and len(builder._flows) == 1  # only the survivor on host a gets an arrow
    assert not [e for e in trace if e["ph"] in ("s", "f")], "an arrow is written when its recovery is known"


def test_a_host_mates_failure_seen_before_its_hosts_loss_leaves_no_arrow_pointing_nowhere() -> None:
    """A whole host SIGKILLed: one worker's closed stream often arrives before its agent's."""
    rig, builder, trace, clock = _rig_with_trace()
    ids = rig.start_elastic({"a": 1, "b": 2})
    rig.now = 5.0
    clock[0] = 5_000_000
    rig.worker_disconnected(ids[1])  # b's first worker, then b itself
    rig.agent_disconnected("b")
    trace += builder.on_spans(ids[0], [pb.Span(kind=pb.SPAN_RESTORE, start_us=5_000_100, duration_us=500, rank=0,
                                               generation=1)])
    trace += builder.close(6_000_000)
    starts = {e["id"]: e for e in trace if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace if e["ph"] == "f"}
    assert len(starts) == 1 and starts.keys() == ends.keys(), (starts, ends)  # to host a's survivor alone
    assert next(iter(ends.values()))["tid"] == 0


def test_the_trace_file_is_json_rotates_at_its_bound_and_repeats_the_track_names(tmp_path) -> None:
    path = tmp_path / "timeline.json"
    head = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rendezvous"}}]
    trace = TraceFile(path, max_bytes=4000, head=lambda: head)
    event = {"name": "commit", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 0}
    for i in range(200):
        trace.write([{**event, "ts": i}])
    trace.flush()
    live = path.read_text()
    assert live.startswith("[\n") and not live.rstrip().endswith("]")  # readable by Chrome while the job runs
    trace.close([{**event, "name": "last"}])
    newest, older = json.loads(path.read_text()), json.loads((tmp_path / "timeline.json.1").read_text())
    assert trace.rotations >= 2
    assert newest[0] == head[0] and older[0] == head[0]
    assert len(path.read_text()) <= 4000 + 200 and newest[-1]["name"] == "last"
    assert older[-1]["ts"] + 1 == newest[1]["ts"]  # nothing lost between the two files


def test_a_timeline_that_cannot_be_written_stops_quietly_and_the_job_goes_on(tmp_path) -> None:
    said: list[str] = []
    # /dev/full: every write that reaches it fails with ENOSPC, as on a full disk.
    timeline = JobTimeline("/dev/full", 1 << 20, TraceBuilder(lambda: []), lambda: 5, said.append)
    timeline.on_event(Event(Kind.JOB_RECOVERED, {"seconds": 1.0}))
    timeline.flush()
    timeline.on_spans("w", [pb.Span(kind=pb.SPAN_COMMIT, start_us=9, duration_us=1)], 0)
    timeline.close()
    assert len(said) == 1 and "/dev/full" in said[0] and "space" in said[0] and timeline.file is None
    with pytest.raises(Exception, match="cannot write the timeline"):
        TraceFile(tmp_path / "no" / "such" / "folder.json", 100, lambda: [])


def test_the_timeline_file_comes_from_the_flag_then_the_environment(tmp_path, monkeypatch) -> None:
    t, x, r = (str(tmp_path / name) for name in ("t.json", "x.json", "r.json"))
    assert timeline_path(None, {}) is None
    assert timeline_path(t, {"HOROVOD_TIMELINE": x}) == t
    assert timeline_path(None, {"HOROVOD_TIMELINE": x}) == x
    assert timeline_path(None, {"HOROVOD_TIMELINE": x, "RINGMASTER_TIMELINE": r}) == r
    monkeypatch.chdir(tmp_path)
    assert timeline_path(None, {"RINGMASTER_TIMELINE": "rel.json"}) == str(tmp_path / "rel.json")
    with pytest.raises(UsageError, match="DYNAMIC"):
        timeline_path(None, {"HOROVOD_TIMELINE": "DYNAMIC"})
    with pytest.raises(UsageError, match="cannot write in .*no/such"):
        timeline_path(str(tmp_path / "no" / "such" / "t.json"), {})
    with pytest.raises(UsageError, match="that is a folder"):
        timeline_path(str(tmp_path), {})


def test_a_timeline_file_left_from_before_is_kept_as_file_1(tmp_path) -> None:
    path = tmp_path / "t.json"
    path.write_text("[\n{\"name\": \"an earlier run\"}\n]\n")
    TraceFile(path, 1 << 20, lambda: []).close()
    assert json.loads((tmp_path / "t.json.1").read_text()) == [{"name": "an earlier run"}]
    assert json.loads(path.read_text()) == []


def test_a_symbolic_link_planted_at_the_timeline_is_refused_not_followed(tmp_path) -> None:
    """A link at FILE pointing where the rendezvous may write (a dangling one too) would have it
    create or overwrite that file."""
    target = tmp_path / "elsewhere" / "authorized_keys"
    target.parent.mkdir()
    link = tmp_path / "t.json"
    link.symlink_to(target)
    with pytest.raises(Exception, match="is a symbolic link"):
        TraceFile(link, 1 << 20, lambda: [])
    assert not target.exists() and link.is_symlink()
    target.write_text("keep me\n")  # a link to a file that exists is refused too, and the file untouched
    with pytest.raises(Exception, match="is a symbolic link"):
        TraceFile(link, 1 << 20, lambda: [])
    assert target.read_text() == "keep me\n"


def test_a_drain_is_a_span_on_the_hosts_track_from_its_request_to_its_workers_gone() -> None:
    from ringmaster.rendezvous.server.timeline import HOSTS_TID

    rig = Rig(min_np=1)
    builder = TraceBuilder(lambda: [])
    trace: list[dict] = []
    clock = [0]
    rig.coordinator.job.on_event = lambda event: trace.extend(builder.on_event(event, clock[0]))
    ids = rig.start_elastic({"a": 1, "b": 1})
    clock[0] = 1_000_000
    rig.drain_host("b", 30.0)
    clock[0] = 1_400_000
    rig.commit_at_update(ids, 1)
    rig.worker_exited("b", ids[1], 0, 0, False)
    (span,) = [e for e in trace if e["ph"] == "X" and e["tid"] == HOSTS_TID]
    assert span["name"] == "b: drain (commit)" and span["ts"] == 1_000_000 and span["dur"] == 400_000
    assert any(e["ph"] == "i" and e["name"] == "b: draining" for e in trace)
