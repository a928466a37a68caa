"""A large job's messages to its workers carried by their agent (`worker/agent/event_relay.py`,
`ringmaster/common/event_relay.py`): real processes, real datagrams. A worker takes a message
only from its agent (its parent, by the kernel's word) and the agent keeps each worker's
messages in order when the worker cannot take them yet."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from typing import Iterator

import pytest
from harness import wait_for

from ringmaster.common.event_relay import MAX_EVENT_BYTES, EventReceiver, socket_name
from ringmaster.discovery import MAX_SLOTS_PER_HOST
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.worker.agent.event_relay import MAX_WAITING, EventForwarder

#: A worker's side: listens in the folder it is given, prints each message it takes, and its
#: refused count for every line on stdin. Its parent (this test) is its agent.
WORKER = """
import sys
from ringmaster.common.event_relay import EventReceiver
a = lambda m: m.assignment  # (a rank and local rank printed where either is set)
receiver = EventReceiver(sys.argv[1], lambda m: print("got", m.WhichOneof("event"), a(m).generation,
                                                      m.hosts_updated.sequence,
                                                      *((a(m).rank, a(m).local_rank, a(m).local_size,
                                                         a(m).cross_rank, a(m).cross_size)
                                                        if a(m).rank or a(m).local_rank else ()), flush=True))
print("listening" if receiver.listening else "deaf", flush=True)
for line in sys.stdin:
    print("refused", receiver.refused, flush=True)
"""

#: A process of the same user that is not the worker's agent: sends one datagram to a path.
STRANGER = """
import socket, sys
socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(bytes.fromhex(sys.argv[2]), sys.argv[1])
"""


class Rig:
    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="rm-ev-")
        self.pids: dict[str, int] = {}
        self.forwarder = EventForwarder(self.folder, self.pids.get)
        self.procs: list[subprocess.Popen] = []

    def worker(self, worker_id: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", WORKER, self.folder], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        self.pids[worker_id] = proc.pid
        return proc

    @staticmethod
    def line(proc: subprocess.Popen) -> str:
        assert proc.stdout is not None
        return proc.stdout.readline().strip()

    @staticmethod
    def refused(proc: subprocess.Popen) -> int:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("?\n")
        proc.stdin.flush()
        words = proc.stdout.readline().split()
        assert words[0] == "refused", words
        return int(words[1])

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.forwarder.close()
        for name in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, name))
        os.rmdir(self.folder)


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    try:
        yield made
    finally:
        made.close()


def _hosted(worker_id: str, generation: int = 0, hosts_sequence: int = 0) -> pb.HostedEvent:
    if hosts_sequence:
        return pb.HostedEvent(worker_id=worker_id, event=pb.WorkerEvent(
            hosts_updated=pb.HostsUpdated(sequence=hosts_sequence)))
    return pb.HostedEvent(worker_id=worker_id, event=pb.WorkerEvent(assignment=pb.Assignment(generation=generation)))


def test_each_worker_gets_its_own_messages_in_order(rig) -> None:
    first, second = rig.worker("hA/1"), rig.worker("hA/2")
    rig.forwarder.forward([_hosted("hA/1", hosts_sequence=3), _hosted("hA/2", generation=9),
                           _hosted("hA/1", generation=7)])
    assert rig.line(first) == "got hosts_updated 0 3"
    assert rig.line(first) == "got assignment 7 0"
    assert rig.line(second) == "got assignment 9 0"
    assert rig.refused(first) == rig.refused(second) == 0 and rig.forwarder.dropped == 0


def test_a_message_said_alike_to_several_workers_reaches_each_in_its_place(rig) -> None:
    """One entry for many workers (`HostedEvent.also`, a host update to the whole host): each
    named worker gets it, in its order among its own messages; an entry naming more workers than
    a host can have is dropped whole."""
    first, second, third = rig.worker("hA/1"), rig.worker("hA/2"), rig.worker("hA/3")
    shared = _hosted("hA/1", hosts_sequence=5)
    shared.also.extend(["hA/2", "hA/3"])
    rig.forwarder.forward([_hosted("hA/2", generation=4), shared, _hosted("hA/1", generation=8)])
    assert rig.line(first) == "got hosts_updated 0 5" and rig.line(first) == "got assignment 8 0"
    assert rig.line(second) == "got assignment 4 0" and rig.line(second) == "got hosts_updated 0 5"
    assert rig.line(third) == "got hosts_updated 0 5"
    flood = _hosted("hA/1", hosts_sequence=6)
    flood.also.extend(["hA/2"] * MAX_SLOTS_PER_HOST)
    rig.forwarder.forward([flood, _hosted("hA/3", generation=9)])
    assert rig.line(third) == "got assignment 9 0"  # (the flood went nowhere: hA/3 heard the next one)
    assert rig.forwarder.dropped == 1 + MAX_SLOTS_PER_HOST


def test_one_assignment_for_several_workers_gives_each_its_own_place(rig) -> None:
    """An assignment said once for a host's workers (`HostedEvent.places`): each named worker
    gets what they share with its own ranks, in its order among its messages. An entry whose
    places do not match the workers it names, or with places on anything but an assignment, is
    dropped whole (the rendezvous sends neither)."""
    first, second, third = rig.worker("hA/1"), rig.worker("hA/2"), rig.worker("hA/3")
    shared = pb.HostedEvent(worker_id="hA/2", also=["hA/1"], event=pb.WorkerEvent(assignment=pb.Assignment(
        generation=6, rank=4, size=9, local_rank=0, local_size=2, cross_rank=2, cross_size=5)))
    shared.places.add(rank=4, local_rank=0, local_size=2, cross_rank=2, cross_size=5)
    shared.places.add(rank=5, local_rank=1, local_size=2, cross_rank=2, cross_size=4)
    rig.forwarder.forward([_hosted("hA/1", hosts_sequence=3), shared, _hosted("hA/1", generation=8)])
    assert rig.line(first) == "got hosts_updated 0 3"
    assert rig.line(first) == "got assignment 6 0 5 1 2 2 4"
    assert rig.line(first) == "got assignment 8 0"
    assert rig.line(second) == "got assignment 6 0 4 0 2 2 5"
    short = pb.HostedEvent(worker_id="hA/1", also=["hA/2"], event=shared.event)
    short.places.add(rank=7)
    misplaced = _hosted("hA/1", hosts_sequence=4)
    misplaced.places.add(rank=7)
    rig.forwarder.forward([short, misplaced, _hosted("hA/3", generation=9)])
    assert rig.line(third) == "got assignment 9 0"  # (hA/3 heard the next one: the others went nowhere)
    assert rig.forwarder.dropped == 3
    assert rig.refused(first) == rig.refused(second) == 0


def test_a_worker_takes_nothing_but_its_agents_messages(rig) -> None:
    worker = rig.worker("hA/1")
    path = os.path.join(rig.folder, socket_name(worker.pid))
    good = pb.WorkerEvent(assignment=pb.Assignment(generation=5)).SerializeToString()
    stranger = subprocess.run([sys.executable, "-c", STRANGER, path, good.hex()], start_new_session=True, timeout=60)
    assert stranger.returncode == 0  # it went, and is refused: the sender is not the worker's parent
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.sendto(b"\xff\xff\xff not a message", path)  # from its agent, but garbage
    sock.sendto(pb.WorkerEvent(job_ended=pb.JobEnded(reason="over")).SerializeToString(), path)  # only on the stream
    sock.sendto(b"\x00" * (MAX_EVENT_BYTES + 1), path)  # too large
    sock.close()
    wait_for(lambda: rig.refused(worker) == 4, 10, "four datagrams refused")
    rig.forwarder.forward([_hosted("hA/1", generation=6)])
    assert rig.line(worker) == "got assignment 6 0"  # (nothing refused was taken before it)
    rig.forwarder.forward([pb.HostedEvent(worker_id="hA/1", event=pb.WorkerEvent(retire=pb.Retire(reason="go")))])
    assert rig.line(worker) == "got retire 0 0"  # (its parent may retire it: it could stop it anyway)


def test_messages_wait_in_order_while_a_worker_cannot_take_them(rig) -> None:
    """A worker's queue is full (it does not read): the agent keeps the rest, at most MAX_WAITING,
    the newest, and sends them in order as room comes."""
    pid = 4_000_001  # (no such process: the socket stands for a worker that does not read)
    rig.pids["hA/1"] = pid
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.path.join(rig.folder, socket_name(pid)))
    sock.setblocking(False)
    sent = 2000
    rig.forwarder.forward([_hosted("hA/1", generation=n) for n in range(1, sent + 1)])
    assert rig.forwarder._waiting["hA/1"], "the queue never filled"
    got: list[int] = []

    def drain() -> bool:
        try:
            while True:
                got.append(pb.WorkerEvent.FromString(sock.recv(MAX_EVENT_BYTES)).assignment.generation)
        except BlockingIOError:
            pass
        rig.forwarder.retry()
        return not rig.forwarder._waiting
    wait_for(drain, 10, "every waiting message sent")
    drain()
    sock.close()
    assert got == sorted(got) and got[-1] == sent and got[0] == 1
    assert got[-MAX_WAITING:] == list(range(sent - MAX_WAITING + 1, sent + 1))  # the newest waited, in order
    assert len(got) < sent  # ... and no more than MAX_WAITING of them: the older waiting ones were let go


def test_messages_of_a_worker_that_is_gone_or_does_not_listen_are_dropped(rig) -> None:
    rig.pids["hA/2"] = 4_000_002  # (started, but it never listened)
    rig.forwarder.forward([_hosted("hA/1", generation=1), _hosted("hA/2", generation=1)])
    assert rig.forwarder.dropped == 2 and not rig.forwarder._waiting


def test_a_worker_without_its_agents_folder_hears_only_its_stream() -> None:
    assert not EventReceiver("", lambda message: None).listening
    assert not EventReceiver("/nonexistent/folder", lambda message: None).listening
    assert not EventForwarder("", lambda worker_id: None).available
