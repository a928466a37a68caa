"""The agent's side of carried worker messages (see `ringmaster/common/event_relay.py`).

The rendezvous sends a large job's messages for this host's workers in one `AgentCommand`
(`events`); the agent hands each worker its own as a datagram to the worker's socket in the
agent's folder, found by the worker's pid (the process this agent started for it). A message
that cannot go now (the worker's socket buffer is full) waits, with the ones after it for the
same worker, and goes at the next `retry`; a worker that is gone, or never listened, has its
messages dropped (the rendezvous routes through the agent only workers that said they listen).
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from typing import Callable, Iterable

from ringmaster.common.event_relay import MAX_EVENT_BYTES, each_worker, folder_fits, socket_name
from ringmaster.discovery import MAX_SLOTS_PER_HOST
from ringmaster.proto import ringmaster_pb2 as pb

#: Messages kept at most for one worker that cannot take them yet (the oldest go first).
MAX_WAITING = 64
#: Send errors after which a message waits (the worker's queue is full) rather than being dropped.
_WAIT_ERRORS = (errno.EAGAIN, errno.ENOBUFS)


class EventForwarder:
    """Hands carried messages to this host's workers; `pid_of(worker_id)` is the process the agent
    started for a worker (None: not one of its workers now)."""

    def __init__(self, folder: str, pid_of: Callable[[str], int | None]) -> None:
        self.folder = folder
        self._pid_of = pid_of
        self._lock = threading.Lock()
        self._waiting: dict[str, list[bytes]] = {}
        self.dropped = 0  # messages for workers that were gone or did not listen
        self._sock: socket.socket | None = None
        if folder and folder_fits(folder):
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)

    @property
    def available(self) -> bool:
        """Whether this agent can carry messages (said in its hello: `carries_events`)."""
        return self._sock is not None

    def forward(self, events: Iterable[pb.HostedEvent]) -> None:
        """Hand each message to its worker, and to every other worker it names (`also`: said
        alike to many, it came once; an assignment's `places`: each its own ranks), in order (from
        the session thread)."""
        with self._lock:
            for hosted in events:
                named = 1 + len(hosted.also)
                each = each_worker(hosted) if named <= MAX_SLOTS_PER_HOST else None  # (more than a host runs)
                if each is None:
                    self.dropped += named
                    continue
                serialized: dict[int, bytes] = {}  # (one message for all, unless each has its own place)
                for worker_id, event in each:
                    data = serialized.get(id(event))
                    if data is None:
                        data = serialized[id(event)] = event.SerializeToString()
                    if len(data) > MAX_EVENT_BYTES:
                        self.dropped += 1
                        continue
                    queue = self._waiting.get(worker_id)
                    if queue is not None:  # (behind messages still waiting: order kept)
                        queue.append(data)
                        del queue[:-MAX_WAITING]
                    elif not self._send(worker_id, data):
                        self._waiting[worker_id] = [data]

    def retry(self) -> None:
        """Send what waits, oldest first (from the agent's main loop)."""
        if not self._waiting:
            return
        with self._lock:
            for worker_id in list(self._waiting):
                queue = self._waiting[worker_id]
                while queue and self._send(worker_id, queue[0]):
                    queue.pop(0)
                if not queue:
                    del self._waiting[worker_id]

    def _send(self, worker_id: str, data: bytes) -> bool:
        """True when the message went or can never go (dropped); False when it should wait."""
        pid = self._pid_of(worker_id)
        if pid is None or self._sock is None:
            self.dropped += 1
            return True
        try:
            self._sock.sendto(data, os.path.join(self.folder, socket_name(pid)))
            return True
        except OSError as exc:
            if exc.errno in _WAIT_ERRORS:
                return False
            self.dropped += 1  # (no such socket: the worker exited, or does not listen)
            return True

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
