"""A worker template: one warm process per agent from which its workers are forked.

A worker started fresh spends 2.5 s of CPU on the interpreter's and torch's imports before its
script's first line; four workers on a host pay it four times, and on a loaded host they pay it
at once. The template imports what every worker imports (`spare.PRELOADED`) once, then forks
each worker it is asked for (a few milliseconds), which becomes its worker exactly as a warm
spare does (`spare.become`). PyTorch's own DataLoader forks its workers after `import torch` in
the same way; the template has run no user code, made no process group and drawn no random
number when it forks. What a forked worker would otherwise share with its siblings is made its
own: Python's and NumPy's random generators are seeded afresh from the OS.

Run as `python -m ringmaster.worker.agent.template` by its agent (`forked.py`), never by hand.
The agent's socket (`CONTROL_FD_ENV`) carries, one datagram each:
- to the template: a request, JSON `{"ask": n, "assignment": {...}}` with the worker's stdout and
  stderr descriptors attached;
- from it: `{"ready": true}` once warm, `{"ask": n, "pid": p}` (or `"error"`) for each request,
  `{"pid": p, "code": c}` when worker p ended (c as subprocess gives it: -N for signal N).
A worker dies with the template (PR_SET_PDEATHSIG), which dies with its agent; the template ends
when its agent's socket closes.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any

from ringmaster.worker.agent.spare import SPARE_FAILED, Assignment, become, parse_assignment, preload

#: The descriptor of the template's socket to its agent (a SOCK_SEQPACKET pair).
CONTROL_FD_ENV = "RINGMASTER_TEMPLATE_FD"
#: Most bytes a request may have (its assignment: a command line and an environment).
MAX_REQUEST_BYTES = 256 << 10
_PR_SET_PDEATHSIG = 1
#: Signals sent to a host's whole process group (a drain's SIGTERM, a terminal's Ctrl-C or hangup,
#: a batch system's warning): the template ignores them, so its workers (which die with it) get
#: them as fresh workers would, and it goes only with its agent.
HOST_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
_host_signals: dict[int, Any] = {}  # their handlers before the template ignored them


def _send(sock: socket.socket, message: dict) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        pass  # the agent is gone: the template ends at its next read


def serve(sock: socket.socket) -> Assignment | None:
    """Fork workers on request until the agent's socket closes (returns None, in the template),
    or return the assignment of the worker this process has just become by forking."""
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST_BYTES, 2)
                except OSError:
                    data, fds = b"", []
                if not data:
                    return None
                assignment = _forked(sock, data, fds, selector, children)
                if assignment is not None:
                    return assignment
            else:
                pidfd = key.fd
                selector.unregister(pidfd)
                os.close(pidfd)
                pid = children.pop(pidfd)
                _, status = os.waitpid(pid, 0)
                _send(sock, {"pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _forked(sock: socket.socket, data: bytes, fds: list[int], selector: selectors.BaseSelector,
            children: dict[int, int]) -> Assignment | None:
    """Handle one request: fork its worker (returning its assignment in the child), or refuse it."""
    ask = None
    try:
        request = json.loads(data)
        ask = request["ask"]
        if len(fds) != 2:
            raise ValueError("a request needs the worker's stdout and stderr")
        assignment = parse_assignment(json.dumps(request["assignment"]).encode())
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # (what the template wrote must not be written again by the worker)
        pid = os.fork()
    except (ValueError, KeyError, TypeError, OSError, RecursionError) as exc:  # (RecursionError: JSON nested too deep)
        for fd in fds:
            os.close(fd)
        _send(sock, {"ask": ask, "error": f"{type(exc).__name__}: {exc}"})
        return None
    if pid == 0:
        _become_child(sock, fds, selector, children)
        return assignment
    for fd in fds:
        os.close(fd)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # (it cannot be gone before we reap it; a kernel without pidfds: reap when it ends)
        pidfd = None
    if pidfd is not None:
        children[pidfd] = pid
        selector.register(pidfd, selectors.EVENT_READ)
    _send(sock, {"ask": ask, "pid": pid})
    return None


def _become_child(sock: socket.socket, fds: list[int], selector: selectors.BaseSelector,
                  children: dict[int, int]) -> None:
    """In a freshly forked worker: die with the template, leave its descriptors, take the worker's
    output streams and fresh random generators."""
    template = os.getppid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != template:
        os._exit(1)
    selector.close()
    for pidfd in children:
        os.close(pidfd)
    sock.close()
    out, err = fds
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    for sig, handler in _host_signals.items():  # (the template ignores them; its worker has them as a fresh one would)
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # (Python's own `random` reseeds itself after a fork)


def main() -> int:
    control = os.environ.pop(CONTROL_FD_ENV, "")
    if not control.isdigit():
        print("worker template: started without its agent's socket", file=sys.stderr)
        return SPARE_FAILED
    sock = socket.socket(fileno=int(control))
    for sig in HOST_SIGNALS:  # what comes to the whole host (a drain's SIGTERM, a Ctrl-C) is for the workers
        _host_signals[sig] = signal.getsignal(sig)
        signal.signal(sig, signal.SIG_IGN)
    if not preload("worker template"):
        return SPARE_FAILED
    _send(sock, {"ready": True})
    assignment = serve(sock)
    if assignment is None:
        return 0
    become(assignment)
    return 0


if __name__ == "__main__":
    code = main()
    if code:  # a worker's own exit (sys.exit, an exception) never comes here: it leaves through become()
        sys.exit(code)
