"""Workers' `Ready`s carried by their agent (`worker/agent/ready_relay.py`): real worker processes
send real datagrams (`BeatSender.send_ready`, as a worker's Link does), and the agent carries
them over real gRPC to a servicer that records what it is given (the rendezvous' own side is
tested by tests/e2e/test_e2e.py with real agents and workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent import futures
from typing import Iterator

import grpc
import pytest
from harness import wait_for

from ringmaster.common.beat_relay import RELAY_MARK, BeatSender
from ringmaster.proto import environment as env_names
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.worker.agent.ready_relay import GATHER_S, ReadyCarrier

#: A process that sends, for each line on stdin, a Ready asking after that generation.
SENDER = """
import sys
from ringmaster.common.beat_relay import BeatSender
from ringmaster.proto import ringmaster_pb2 as pb
sender = BeatSender()
for line in sys.stdin:
    claimed, after = line.split()
    ready = pb.ReadyRequest(worker_id=claimed, after_generation=int(after), elastic=True)
    print("sent" if sender.relaying() and sender.send_ready(ready.SerializeToString()) else "failed", flush=True)
"""


class Recorder(pb_grpc.RendezvousServicer):
    """Records each carried batch with when it came; refuses the workers named in `refuse`."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, pb.CarriedReady]] = []
        self.refuse: set[str] = set()
        self.lock = threading.Lock()

    def CarryReady(self, request: pb.CarriedReady, context) -> pb.CarriedReadyAnswer:
        with self.lock:
            self.calls.append((time.monotonic(), request))
        answer = pb.CarriedReadyAnswer()
        for ready in request.ready:
            if ready.worker_id in self.refuse:
                answer.refused.add(worker_id=ready.worker_id, reason="it is leaving the job")
        return answer


class Rig:
    def __init__(self, folder: str, running: int) -> None:
        self.recorder = Recorder()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_RendezvousServicer_to_server(self.recorder, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.RendezvousStub(self.channel)
        self.workers: dict[int, str] = {}
        self.running = running
        self.said: list[tuple[str, str]] = []
        self.folder = folder
        open(os.path.join(folder, RELAY_MARK), "w").close()  # (the agent relays: its workers send here)
        self.carrier = ReadyCarrier(folder, "hA", self.workers.get, lambda: self.running, lambda: self.stub,
                                    lambda worker, reason: self.said.append((worker, reason)))
        self.procs: list[subprocess.Popen] = []

    def worker(self, worker_id: str | None) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", SENDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env={**os.environ, env_names.AGENT_BEATS: self.folder},
                                start_new_session=True)
        self.procs.append(proc)
        if worker_id is not None:
            self.workers[proc.pid] = worker_id
        return proc

    @staticmethod
    def ready(proc: subprocess.Popen, claimed: str, after: int) -> str:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{claimed} {after}\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.carrier.close()
        self.channel.close()
        self.server.stop(None)


@pytest.fixture
def rig(tmp_path) -> Iterator[Rig]:
    folder = tmp_path / "beats"
    folder.mkdir(mode=0o700)
    rig = Rig(str(folder), running=2)
    try:
        yield rig
    finally:
        rig.close()


def test_a_hosts_readies_go_in_one_call_each_named_by_the_kernels_word(rig, monkeypatch) -> None:
    from ringmaster.worker.agent import ready_relay
    monkeypatch.setattr(ready_relay, "GATHER_S", 60.0)  # (the call goes once both asked: the window never ends it)
    first, second = rig.worker("hA/1"), rig.worker("hA/2")
    assert rig.ready(first, "hB/9", 4) == "sent"  # it claims another host's worker
    assert rig.ready(second, "hA/2", 4) == "sent"
    wait_for(lambda: rig.recorder.calls, 10, "the carried call")
    [(_, call)] = rig.recorder.calls
    assert call.host == "hA"
    assert sorted((r.worker_id, r.after_generation) for r in call.ready) == [("hA/1", 4), ("hA/2", 4)]


def test_a_lone_ready_goes_after_the_gathering_window_and_a_refusal_is_said(rig) -> None:
    rig.recorder.refuse.add("hA/1")
    worker = rig.worker("hA/1")
    sent = time.monotonic()
    assert rig.ready(worker, "hA/1", 7) == "sent"  # one of the two running: the other may not come
    wait_for(lambda: rig.recorder.calls, 10, "the carried call")
    [(came, call)] = rig.recorder.calls
    assert [r.worker_id for r in call.ready] == ["hA/1"] and came - sent >= GATHER_S * 0.9
    wait_for(lambda: rig.said, 10, "the refusal said")
    assert rig.said == [("hA/1", "it is leaving the job")]


def test_a_stranger_or_garbage_is_refused_and_nothing_is_carried(rig) -> None:
    stranger = rig.worker(None)  # a process the agent did not start
    assert rig.ready(stranger, "hA/1", 1) == "sent"
    rig.workers[os.getpid()] = "hA/3"  # (this process, as one of its workers, sends what is not a Ready)
    garbage = BeatSender(rig.folder)
    assert garbage._send(b"\xff\xff\xff not a Ready", "ready.sock")
    wait_for(lambda: rig.carrier.refused == 2, 10, "both datagrams refused")
    garbage.close()
    assert rig.recorder.calls == []
