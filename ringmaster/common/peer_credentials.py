"""Who sent a datagram on a host-local Unix socket, in the kernel's words (`SCM_CREDENTIALS`).

The relays between an agent and its workers (beat_relay.py, event_relay.py) tell their peers
apart by the sender's pid and uid as the kernel states them, never by what a datagram says.
The receiving socket needs `SO_PASSCRED`; `recvmsg` needs `ANCILLARY_SPACE` for them.
"""

from __future__ import annotations

import socket
import struct
from typing import Callable

#: Longest path of a Unix socket (sun_path, with its terminating zero).
MAX_SOCKET_PATH = 107
#: struct ucred: pid, uid, gid.
_UCRED = struct.Struct("iII")
#: Room `recvmsg` needs for the credentials.
ANCILLARY_SPACE = socket.CMSG_SPACE(_UCRED.size)


def sender_of(ancillary: list[tuple[int, int, bytes]]) -> tuple[int, int] | None:
    """(pid, uid) of the process that sent a datagram, from `recvmsg`'s ancillary data; None
    when the kernel did not say."""
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(value) >= _UCRED.size:
            pid, uid, _ = _UCRED.unpack(value[:_UCRED.size])
            return pid, uid
    return None


def receive(sock: socket.socket, max_bytes: int, take: Callable[[bytes, tuple[int, int] | None], bool],
            refused: Callable[[], None]) -> None:
    """Read datagrams until `sock` is closed: each of at most `max_bytes` goes to `take(data,
    sender)`; one that is larger, or that `take` turns down (False), counts as `refused()`."""
    while True:
        try:
            data, ancillary, flags, _ = sock.recvmsg(max_bytes + 1, ANCILLARY_SPACE)
        except OSError:
            return  # closed: its owner is stopping
        if flags & socket.MSG_TRUNC or len(data) > max_bytes or not take(data, sender_of(ancillary)):
            refused()
