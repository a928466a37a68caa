"""Workers' heartbeats carried by their agent: the worker's side, and the names both sides use.

A large job's rendezvous cannot take a call per worker per interval (heartbeat_pace.py), so it
asks agents to relay (`Ack.relay_beats`): the agent marks its beats folder (`RELAY_MARK`), and a
worker that sees the mark sends its heartbeat as a datagram to the agent's socket in that folder
instead of calling the rendezvous. The agent tells its workers apart by the kernel's word on who
sent each datagram (the sender's pid), never by what the datagram says, so a worker speaks for
itself only, as on the wire. Without the mark, or when the datagram cannot be sent (the agent is
gone or behind), the worker calls the rendezvous as before: relaying saves calls, it is never
what keeps a worker alive.

A worker's `Ready` goes the same way while the agent relays (`READY_SOCKET`, beside the beats'):
a membership change asks one of every member, and the agent carries its host's together in one
call (`CarryReady`, worker/agent/ready_relay.py). One that cannot be sent is called as before.
"""

from __future__ import annotations

import os
import socket

from ringmaster.proto import environment as env_names

#: The agent's socket and the mark that says "relay", in the folder named by `env_names.AGENT_BEATS`.
BEATS_SOCKET = "beats.sock"
RELAY_MARK = "relay"
#: The agent's socket for its workers' `Ready`s, in the same folder.
READY_SOCKET = "ready.sock"
#: Largest `Ready` datagram (a failure's reason is the only field of any size).
MAX_READY_BYTES = 16 * 1024
#: Largest datagram a worker sends (its figures and at most `MAX_RELAYED_SPANS` spans fit).
MAX_BEAT_BYTES = 256 * 1024
#: Most timeline spans one relayed beat carries (about 40 bytes each); the rest wait for the next.
MAX_RELAYED_SPANS = 2048


class BeatSender:
    """A worker's way to its agent's beats socket (from `$RINGMASTER_AGENT_BEATS`; none: never relays)."""

    def __init__(self, folder: str | None = None) -> None:
        self.folder = os.environ.get(env_names.AGENT_BEATS, "") if folder is None else folder
        self._sock: socket.socket | None = None

    def relaying(self) -> bool:
        """Whether the agent asks for this worker's beats now (its mark is in the folder)."""
        return bool(self.folder) and os.path.exists(os.path.join(self.folder, RELAY_MARK))

    def send(self, payload: bytes) -> bool:
        """Send one beat to the agent without waiting; False if it did not go (no agent, full queue)."""
        return len(payload) <= MAX_BEAT_BYTES and self._send(payload, BEATS_SOCKET)

    def send_ready(self, payload: bytes) -> bool:
        """Send one `Ready` to the agent, which carries it on; False if it did not go."""
        return len(payload) <= MAX_READY_BYTES and self._send(payload, READY_SOCKET)

    def _send(self, payload: bytes, name: str) -> bool:
        if not self.folder:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto(payload, os.path.join(self.folder, name))
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
