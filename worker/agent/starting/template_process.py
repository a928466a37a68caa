"""A worker template: one warm process per agent from which its workers are forked.

A worker started fresh spends 2.5 s of CPU on the interpreter's and torch's imports before its
script's first line; four workers on a host pay it four times, and on a loaded host they pay it
at once. The template imports what every worker imports (`spare_process.PRELOADED`) once, then forks
each worker it is asked for (a few milliseconds), which becomes its worker exactly as a warm
spare does (`spare_process.become`). PyTorch's own DataLoader forks its workers after `import torch` in
the same way; the template has run no user code, made no process group and drawn no random
number when it forks. What a forked worker would otherwise share with its siblings is made its
own: Python's and NumPy's random generators are seeded afresh from the OS.

Run as `python -m ringmaster.worker.agent.starting.template_process` by its agent (`template.py`), never by hand.
The agent's socket (`CONTROL_FD_ENV`) carries, one datagram each:
- to the template: a request, JSON `{"ask": n, "assignment": {...}, "argv": [...]}` with the
  worker's stdout and stderr descriptors attached (`argv`: the command as given, its title in ps);
- from it: `{"ready": true}` once warm (or `{"ready": false, "error": why}`: forking is not safe),
  `{"ask": n, "pid": p}` (or `"error"`, with `"unsafe": true` where no fork is safe any more) for
  each request, `{"pid": p, "code": c}` when worker p ended (c as subprocess gives it: -N for signal N).
A worker dies with the template (PR_SET_PDEATHSIG), which dies with its agent; the template ends
when its agent's socket closes.

A fork is safe only while the template has not initialized CUDA (a CUDA context does not survive
a fork: the worker's first CUDA call fails). The template imports torch without touching the GPU;
`fork_hazard` checks it before every fork, and a child forked at warm-up checks torch's own
"bad fork" flag, so that a library that initializes CUDA at import turns the template off (the
host's workers start fresh) instead of handing out workers that cannot use their GPU.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any, Mapping

import setproctitle

from ringmaster.worker.agent.starting.spare_process import SPARE_FAILED, Assignment, become, parse_assignment, preload

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


def fork_hazard(modules: Mapping[str, Any] = sys.modules) -> str | None:
    """Why forking a worker from this process is not safe now, or None: CUDA initialized here
    (torch's own test for it; the template must never have touched the GPU)."""
    torch = modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None
    if cuda.is_initialized():
        return "CUDA was initialized in the worker template: a worker forked from it could not use the GPU"
    if getattr(cuda, "_is_in_bad_fork", lambda: False)():
        return "the worker template was itself forked from a process that initialized CUDA"
    return None


def probe_fork() -> str | None:
    """Fork a child that asks torch whether it is in a bad fork (CUDA initialized before the
    fork), as a worker would find at its first CUDA call; why forking is unsafe, or None."""
    pid = os.fork()
    if pid == 0:
        code = 1 if fork_hazard() else 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return "a child forked from the worker template is in a bad fork (CUDA was initialized before it)"
    return None


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
        hazard = fork_hazard()
        if hazard is not None:
            for fd in fds:
                os.close(fd)
            _send(sock, {"ask": ask, "error": hazard, "unsafe": True})
            return None
        if len(fds) != 2:
            raise ValueError("a request needs the worker's stdout and stderr")
        assignment = parse_assignment(json.dumps(request["assignment"]).encode())
        title = request.get("argv")
        if not isinstance(title, list) or not all(isinstance(part, str) for part in title):
            raise ValueError("a request's argv is not a list of strings")
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # (what the template wrote must not be written again by the worker)
        template = os.getpid()  # (read before the fork: a child reading its parent after it may read init's)
        # Host signals are blocked across the fork: one that comes before the child has its own
        # handlers back stays pending (a blocked signal is never discarded as ignored) and is
        # delivered once the child unblocks it, as a fresh worker would have had it.
        signal.pthread_sigmask(signal.SIG_BLOCK, HOST_SIGNALS)
        try:
            pid = os.fork()
        finally:
            if os.getpid() == template:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, HOST_SIGNALS)
    except (ValueError, KeyError, TypeError, OSError, RecursionError) as exc:  # (RecursionError: JSON nested too deep)
        for fd in fds:
            os.close(fd)
        _send(sock, {"ask": ask, "error": f"{type(exc).__name__}: {exc}"})
        return None
    if pid == 0:
        _become_child(sock, fds, selector, children, template, title)
        return assignment
    for fd in fds:
        os.close(fd)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:  # (the agent checked pidfds work here: a worker it could not watch is not handed out)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        _send(sock, {"ask": ask, "error": f"no pidfd for the forked worker ({exc})", "unsafe": True})
        return None
    children[pidfd] = pid
    selector.register(pidfd, selectors.EVENT_READ)
    _send(sock, {"ask": ask, "pid": pid})
    return None


def warm_up() -> str | None:
    """Make the imported template ready to fork: why forking is unsafe here, or None.

    What the imports made stays out of the collector (`gc.freeze()`): each forked worker's first
    full collection would otherwise walk (and so copy, page by page) every object torch made in the
    template. No collection first: one after torch's imports found some ten objects to free and
    took 0.12-0.15 s of an idle core, on the path of a new host's first worker."""
    unsafe = fork_hazard() or probe_fork()
    if unsafe is None:
        gc.freeze()
    return unsafe


def _become_child(sock: socket.socket, fds: list[int], selector: selectors.BaseSelector,
                  children: dict[int, int], template: int, argv: list[str]) -> None:
    """In a freshly forked worker: die with the template (`template`: its pid, read before the
    fork), leave its descriptors, take the worker's output streams, its own command line in ps
    and /proc (`argv`), its host signals back and fresh random generators."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != template:  # the template died before the death signal was armed
        os._exit(1)
    _set_title(argv)
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
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HOST_SIGNALS)  # (one that came meanwhile is delivered now)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # (Python's own `random` reseeds itself after a fork)


def _set_title(argv: list[str]) -> None:
    """Show the worker's own command in ps and /proc (what a fresh worker shows). An argument that
    is not UTF-8 (held as surrogate escapes, as the OS gave it) is shown with a replacement
    character: the title is for people, the worker's sys.argv keeps the bytes."""
    title = " ".join(argv).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    try:
        setproctitle.setproctitle(title)
    except Exception:  # noqa: BLE001 (a title is never worth a worker)
        pass


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
    unsafe = warm_up()
    if unsafe is not None:
        _send(sock, {"ready": False, "error": unsafe})
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
