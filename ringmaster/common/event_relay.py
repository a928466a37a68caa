"""A large job's messages to its workers, carried by their agents: the names both sides use, and
the worker's side.

A change of membership at 4,096 hosts x 8 workers would send 32,768 messages, one per worker
stream, each costing the rendezvous a fraction of a millisecond of its one Python process. For a
job whose beats are relayed (heartbeat_pace.py), it sends one `AgentCommand` per host instead,
carrying the host's workers' messages (`AgentCommand.events`), and the agent hands each worker
its own as a datagram to the worker's socket in the agent's private folder (the folder of the
relayed beats, `$RINGMASTER_AGENT_BEATS`, 0700).

The worker binds its socket before its session's hello and says so (`WorkerHello.hears_agent`):
the rendezvous routes through the agent only a worker that listens, so a worker that could not
bind hears everything on its own stream as before. It takes a datagram only from its agent, by
the kernel's word on the sender (`SCM_CREDENTIALS`: the sender's pid is its parent's, the agent
that started it; never what the datagram says), and at most `MAX_EVENT_BYTES`. The messages are
the ones its stream would carry, and a worker keeps them as facts that do not depend on their
order (the newest assignment, each generation's end, the highest host update), so the two ways
in never disagree. "Job ended" always comes on the worker's own stream, and ends it; a worker told
to retire by its agent leaves, and its leaving closes its session.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Callable

from google.protobuf.message import DecodeError

from ringmaster.common.peer_credentials import MAX_SOCKET_PATH, receive
from ringmaster.proto import environment as env_names
from ringmaster.proto import ringmaster_pb2 as pb

#: Largest datagram of one worker message (an assignment is about 100 bytes; reasons are bounded).
MAX_EVENT_BYTES = 64 * 1024
#: The longest name `socket_name` gives (pids are at most 7 digits on Linux: pid_max <= 2**22).
LONGEST_NAME = len("events-4194304.sock")


def socket_name(pid: int) -> str:
    """The file name of worker process `pid`'s socket in its agent's folder."""
    return f"events-{pid}.sock"


def folder_fits(folder: str) -> bool:
    """Whether every worker's socket path in `folder` fits a Unix socket address."""
    return len(folder.encode()) + 1 + LONGEST_NAME <= MAX_SOCKET_PATH


def each_worker(hosted: pb.HostedEvent) -> list[tuple[str, pb.WorkerEvent]] | None:
    """(worker id, its message) for each worker a carried entry names, in the order named: one
    message for them all, or, for an assignment with places (`HostedEvent.places`), each with its
    own ranks. None where the entry is malformed: places that do not match the workers named, or
    places on anything but an assignment (the rendezvous never sends either)."""
    named = (hosted.worker_id, *hosted.also)
    if not hosted.places:
        shared = hosted.event  # (one object for all: serialized once)
        return [(worker_id, shared) for worker_id in named]
    if len(hosted.places) != len(named) or hosted.event.WhichOneof("event") != "assignment":
        return None
    out = []
    for worker_id, place in zip(named, hosted.places):
        event = pb.WorkerEvent()
        event.CopyFrom(hosted.event)
        into = event.assignment
        into.rank, into.local_rank, into.local_size = place.rank, place.local_rank, place.local_size
        into.cross_rank, into.cross_size = place.cross_rank, place.cross_size
        out.append((worker_id, event))
    return out


def agent_of_this_process() -> int:
    """The pid of this worker's agent: its parent, or the agent that forked it from its template."""
    told = os.environ.get(env_names.AGENT_PID, "")
    return int(told) if told.isdigit() else os.getppid()


class EventReceiver:
    """A worker's socket for the messages its agent carries; `on_event(message)` runs on its thread."""

    def __init__(self, folder: str, on_event: Callable[[pb.WorkerEvent], None],
                 agent_pid: Callable[[], int] | None = None) -> None:
        self.refused = 0  # datagrams dropped: not from the agent, too large, not a worker message
        self._on_event = on_event
        self._agent_pid = agent_pid or agent_of_this_process
        self._sock: socket.socket | None = None
        self.path = os.path.join(folder, socket_name(os.getpid())) if folder else ""
        if not folder or not folder_fits(folder):
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            _remove(self.path)  # (left by an earlier process of the same pid: pids are reused)
            sock.bind(self.path)
        except OSError:
            sock.close()  # (the folder is gone, or not ours: the worker hears its own stream)
            return
        self._sock = sock
        threading.Thread(target=self._receive, args=(sock,), daemon=True, name="ringmaster-agent-events").start()

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
            _remove(self.path)

    def _receive(self, sock: socket.socket) -> None:
        receive(sock, MAX_EVENT_BYTES, self._take, self._refuse)

    def _refuse(self) -> None:
        self.refused += 1

    def _take(self, data: bytes, sender: tuple[int, int] | None) -> bool:
        """A datagram from its agent that is a worker message, not the job's end (which ends its
        stream: it comes on it). A retirement from its agent is taken: the agent is the parent
        that started it, and could stop it anyway."""
        agent = self._agent_pid()
        if sender is None or agent <= 1 or sender != (agent, os.getuid()):
            return False
        try:
            message = pb.WorkerEvent.FromString(data)
        except DecodeError:
            return False
        if message.WhichOneof("event") == "job_ended":  # (only ever said on the stream)
            return False
        self._on_event(message)
        return True


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
