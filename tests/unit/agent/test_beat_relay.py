"""Workers' heartbeats carried by their agent (`worker/agent/beat_relay.py`,
`ringmaster/common/beat_relay.py`): real processes send real datagrams; the agent knows each
sender by the kernel's word, whatever the datagram says."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest
from harness import wait_for

from ringmaster.common.beat_relay import BeatSender
from ringmaster.proto import environment as env_names
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.worker.agent.beat_relay import BeatCollector

#: A process that sends, after a line on stdin, the bytes (hex) it was given, as a worker's Link does.
SENDER = """
import sys
from ringmaster.common.beat_relay import BeatSender
sender = BeatSender()
for line in sys.stdin:
    print("sent" if sender.send(bytes.fromhex(line.strip())) else "failed", flush=True)
"""


class Senders:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", SENDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True,
                                env={**os.environ, env_names.AGENT_BEATS: self.folder}, start_new_session=True)
        self.procs.append(proc)
        return proc

    @staticmethod
    def send(proc: subprocess.Popen, payload: bytes) -> str:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(payload.hex() + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()


@pytest.fixture
def rig() -> Iterator[tuple[BeatCollector, dict[int, str], Senders]]:
    workers: dict[int, str] = {}
    collector = BeatCollector(workers.get)
    senders = Senders(collector.folder)
    try:
        yield collector, workers, senders
    finally:
        for proc in senders.procs:
            proc.kill()
            proc.wait()
        collector.close()


def _beat(worker_id: str, commits: int, spans: int = 0) -> bytes:
    return pb.WorkerHeartbeatRequest(worker_id=worker_id, commits=commits, elastic=True,
                                     spans=[pb.Span(kind=pb.SPAN_COMMIT, start_us=i,
                                                    duration_us=1) for i in range(spans)]
                                     ).SerializeToString()


def test_a_beat_is_kept_as_the_process_that_sent_it_whatever_it_says(rig) -> None:
    collector, workers, senders = rig
    worker = senders.start()
    workers[worker.pid] = "hA/1"
    assert senders.send(worker, _beat("hB/9", commits=7)) == "sent"  # it claims another worker's id
    beats = wait_for(lambda: collector.take({"hA/1"}), 10, "the beat to arrive")
    assert [(b.beat.worker_id, b.beat.commits) for b in beats] == [("hA/1", 7)]
    assert 0.0 <= beats[0].age_s < 10.0
    assert senders.send(worker, _beat("hA/1", commits=8)) == "sent"
    wait_for(lambda: [b for b in collector.take({"hA/1"}) if b.beat.commits == 8], 10, "the newer beat to replace it")
    assert collector.take(set()) == []  # a worker no longer running: its beat goes


def test_a_stranger_or_garbage_is_refused(rig) -> None:
    collector, workers, senders = rig
    stranger, worker = senders.start(), senders.start()
    workers[worker.pid] = "hA/1"
    assert senders.send(stranger, _beat("hA/1", commits=5)) == "sent"  # not a process the agent started
    assert senders.send(worker, b"\xff\xff\xff not a heartbeat") == "sent"
    wait_for(lambda: collector.refused == 2, 10, "both datagrams refused")
    assert collector.take({"hA/1"}) == []


def test_spans_gather_within_a_bound_and_the_rest_are_counted(rig, monkeypatch) -> None:
    from ringmaster.worker.agent import beat_relay
    monkeypatch.setattr(beat_relay, "MAX_SPANS_PER_HEARTBEAT", 10)
    collector, workers, senders = rig
    worker = senders.start()
    workers[worker.pid] = "hA/1"
    for _ in range(3):
        assert senders.send(worker, _beat("hA/1", commits=1, spans=4)) == "sent"
    wait_for(lambda: collector._latest.get("hA/1") and collector.refused == 0
             and len(collector._latest["hA/1"].spans) + collector._latest["hA/1"].dropped == 12, 10, "three beats")
    [relayed] = collector.take({"hA/1"})
    assert len(relayed.beat.spans) == 10 and relayed.beat.spans_dropped == 2


def test_the_mark_tells_workers_whether_to_relay(rig) -> None:
    collector, _, _ = rig
    sender = BeatSender(collector.folder)
    assert not sender.relaying() and not collector.relaying
    collector.relay(True)
    assert sender.relaying() and collector.relaying
    collector.relay(False)
    assert not sender.relaying()
    assert not BeatSender("").relaying() and not BeatSender("").send(b"x")  # no agent folder: never relays


def test_with_the_agent_gone_a_worker_calls_the_rendezvous_itself(rig) -> None:
    collector, workers, senders = rig
    worker = senders.start()
    collector.close()
    assert senders.send(worker, _beat("hA/1", commits=1)) == "failed"
