"""Cutting a generation's mesh off: its Gloo connections shut down, so no collective waits on it.

torch's Gloo process groups cannot be aborted: `abort()` and `shutdown()` leave a collective
blocked, and only freeing the group closes its sockets, which torch's own references to the
modules sharded on it prevent (measured, torch 2.13). A survivor inside an FSDP2 collective
that a peer left (it failed in another one and rolled back) would wait the collective timeout.
So the sockets the mesh's groups opened (those that appeared while it was built) are recorded,
and shut down (`shutdown(2)`, both ways) when the generation is over or the mesh is released:
a collective blocked on one fails at once, here ("Connection closed by peer") and on the peer.
Only connected sockets: shutting a Gloo listener down ends its process (its accept thread
aborts). Each is checked to be the same socket (its inode) before it is shut down, since a
closed descriptor's number is reused.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Protocol

FD_FOLDER = "/proc/self/fd"


class _Over(Protocol):
    def wait_generation_over(self, generation: int, timeout_s: float) -> str | None: ...


def open_sockets() -> dict[str, int]:
    """This process' sockets now: {"socket:[inode]": descriptor} (empty where /proc is not)."""
    found: dict[str, int] = {}
    try:
        names = os.listdir(FD_FOLDER)
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"{FD_FOLDER}/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            found[target] = int(name)
    return found


def opened_since(before: dict[str, int]) -> dict[str, int]:
    """The sockets opened since `before` was taken (and still open)."""
    return {inode: fd for inode, fd in open_sockets().items() if inode not in before}


def cut(sockets: dict[str, int]) -> int:
    """Shut down each connected socket of `sockets` that is still the one recorded. Returns how many."""
    done = 0
    for inode, fd in sockets.items():
        try:
            if os.readlink(f"{FD_FOLDER}/{fd}") != inode:
                continue  # closed, its number now another socket's
            view = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if view.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue  # a listener: shutting it down aborts Gloo's accept thread
            view.getpeername()
            view.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            pass  # not connected, or already shut down
        finally:
            view.close()
    return done


def cut_when_over(link: _Over, generation: int, sockets: dict[str, int], released: threading.Event) -> threading.Thread:
    """A thread that cuts `sockets` once `generation` is over (or the worker leaves), unless the
    mesh is `released` first (release cuts them itself)."""

    def watch() -> None:
        while not released.is_set():
            if link.wait_generation_over(generation, 1.0) is not None:
                if not released.is_set():
                    cut(sockets)
                return

    thread = threading.Thread(target=watch, name=f"ringmaster-mesh-cut-{generation}", daemon=True)
    thread.start()
    return thread
