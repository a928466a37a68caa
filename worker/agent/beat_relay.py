"""The agent's side of relayed heartbeats (see `ringmaster/common/beat_relay.py`).

A thread receives the workers' beats on a datagram socket in a private folder (0700) and keeps
the latest of each worker with the time it came; the agent's heartbeat takes them
(`take`). Who sent a beat is the kernel's word (`SCM_CREDENTIALS`: the sender's pid, mapped to
the worker the agent started as that process); a datagram from any other process, of another
user, too large or not a heartbeat is dropped and counted. Timeline spans gather between the
agent's heartbeats up to a bound, and the rest are counted as dropped, as a worker's own buffer
does.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from google.protobuf.message import DecodeError, Message

from ringmaster.common.beat_relay import BEATS_SOCKET, MAX_BEAT_BYTES, RELAY_MARK
from ringmaster.common.peer_credentials import MAX_SOCKET_PATH, receive
from ringmaster.common.spans import MAX_SPANS_PER_HEARTBEAT
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.worker.agent.leftovers import folder_prefix

#: The socket's receive buffer asked for: the beats of a host's workers between two reads.
RECEIVE_BUFFER_BYTES = 4 << 20


@dataclass
class _Latest:
    beat: pb.WorkerHeartbeatRequest
    received: float
    spans: list[pb.Span] = field(default_factory=list)
    dropped: int = 0  # spans this agent could not carry


def workers_socket(path: str, receive_buffer: int | None = None) -> socket.socket | None:
    """A datagram socket at `path` that learns each sender from the kernel (`SO_PASSCRED`), for
    the agent's workers to send to; None when the path is too long for a Unix socket."""
    if len(path.encode()) > MAX_SOCKET_PATH:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.bind(path)
    return sock


M = TypeVar("M", bound=Message)


def worker_message(data: bytes, sender: tuple[int, int] | None, worker_of: Callable[[int], str | None],
                   kind: type[M]) -> tuple[str, M] | None:
    """(worker id, message) of a datagram from a worker this agent started, by the kernel's word
    on the sender (never the datagram's), that is a `kind`; None for anything else."""
    worker_id = worker_of(sender[0]) if sender is not None and sender[1] == os.getuid() else None
    if worker_id is None:
        return None
    try:
        return worker_id, kind.FromString(data)
    except DecodeError:
        return None


class BeatCollector:
    """Receives the workers' beats; `worker_of(pid)` names the worker a process is (None: not ours)."""

    def __init__(self, worker_of: Callable[[int], str | None], clock: Callable[[], float] = time.monotonic) -> None:
        self._worker_of = worker_of
        self._clock = clock
        self.folder = tempfile.mkdtemp(prefix=folder_prefix("beats"))
        self._lock = threading.Lock()
        self._latest: dict[str, _Latest] = {}
        self.refused = 0  # datagrams dropped: not from one of our workers, too large, not a heartbeat
        self._relay = False
        self._sock = workers_socket(os.path.join(self.folder, BEATS_SOCKET), RECEIVE_BUFFER_BYTES)
        if self._sock is not None:  # (else no relay: the workers keep calling themselves)
            threading.Thread(target=self._receive, args=(self._sock,), daemon=True, name="beats").start()

    @property
    def available(self) -> bool:
        return self._sock is not None

    @property
    def relaying(self) -> bool:
        """Whether the workers were asked to send their beats here."""
        return self._relay

    def relay(self, on: bool) -> None:
        """Ask the workers to send their beats here (`on`) or to the rendezvous, by the folder's mark."""
        if on == self._relay or self._sock is None:
            return
        mark = os.path.join(self.folder, RELAY_MARK)
        try:
            if on:
                open(mark, "w").close()
            else:
                os.unlink(mark)
            self._relay = on
        except OSError:
            pass  # (the folder is gone: the agent is stopping)

    def take(self, running: set[str]) -> list[pb.RelayedBeat]:
        """The latest beat of each worker still `running`, with its age; their spans go with them
        (at most MAX_SPANS_PER_HEARTBEAT in all, the rest counted as dropped)."""
        now = self._clock()
        out = []
        with self._lock:
            for worker_id in [w for w in self._latest if w not in running]:
                del self._latest[worker_id]
            share = MAX_SPANS_PER_HEARTBEAT // max(1, len(self._latest))
            for latest in self._latest.values():
                beat = pb.WorkerHeartbeatRequest()
                beat.CopyFrom(latest.beat)
                spans, latest.spans = latest.spans[:share], latest.spans[share:]
                del beat.spans[:]
                beat.spans.extend(spans)
                beat.spans_dropped += latest.dropped
                out.append(pb.RelayedBeat(beat=beat, age_s=max(0.0, now - latest.received)))
        return out

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _receive(self, sock: socket.socket) -> None:
        receive(sock, MAX_BEAT_BYTES, self._take, self._refuse)

    def _refuse(self) -> None:
        self.refused += 1

    def _take(self, data: bytes, sender: tuple[int, int] | None) -> bool:
        """A datagram from a worker this agent started (by the kernel's word) that is a heartbeat."""
        found = worker_message(data, sender, self._worker_of, pb.WorkerHeartbeatRequest)
        if found is None:
            return False
        self._keep(*found)
        return True

    def _keep(self, worker_id: str, beat: pb.WorkerHeartbeatRequest) -> None:
        beat.worker_id = worker_id  # (who sent it is the kernel's word, not the datagram's)
        spans = list(beat.spans)
        del beat.spans[:]
        now = self._clock()
        with self._lock:
            latest = self._latest.get(worker_id)
            if latest is None:
                latest = self._latest[worker_id] = _Latest(beat, now)
            else:
                latest.beat, latest.received = beat, now
            room = MAX_SPANS_PER_HEARTBEAT - len(latest.spans)
            latest.spans.extend(spans[:max(0, room)])
            latest.dropped += max(0, len(spans) - max(0, room))
