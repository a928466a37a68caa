"""The agent's side of its worker template (`template_process.py`): start it, ask it for workers, and
hold each forked worker as the agent holds a process it started (`ForkedProcess`, the part of
`subprocess.Popen` the agent uses).

A worker is forked only where it cannot be told from a fresh process by its script: the same
rules as a warm spare's (`spare_pool.spare_assignment`); otherwise the agent starts it fresh. A
template that cannot import torch, or dies, is said once and not used again; its forked workers
die with it (their exits are reported as deaths by SIGKILL). So is one on a host that gives no
pidfds (a kernel before 5.3, a seccomp profile that refuses `pidfd_open`): the agent holds a
forked worker (signals, its end) only through one, so there it starts every worker fresh. A
request the template answers too late (past `FORK_TIMEOUT_S`: the worker was started fresh
meanwhile) turns the template off, and a worker it forks for that request after all is killed at
once: two processes must never run one worker.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Callable

from ringmaster.common.events import Kind
from ringmaster.common.processes import dying_with_parent
from ringmaster.worker.agent.starting.spare_pool import spare_assignment
from ringmaster.worker.agent.starting.template_process import CONTROL_FD_ENV, MAX_REQUEST_BYTES

#: Seconds the template is given to fork a worker and say its pid.
FORK_TIMEOUT_S = 10.0
#: A template that died takes its workers with it: the exit they are reported with.
TEMPLATE_GONE_CODE = -signal.SIGKILL


class ForkedProcess:
    """A worker forked by the template: its pid, output pipes and exit, as `subprocess.Popen` has them."""

    stdin = None

    def __init__(self, pid: int, stdout: IO[bytes], stderr: IO[bytes], ended: Callable[[int], int | None]) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._ended = ended
        try:
            self._pidfd: int | None = os.pidfd_open(pid)  # signals reach this process, never a reused pid
        except OSError:
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._ended(self.pid)
            if self.returncode is not None and self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None or self._pidfd is None:
            return
        try:
            signal.pidfd_send_signal(self._pidfd, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def pidfd_problem() -> str | None:
    """Why this host cannot hold forked workers through pidfds, or None (it can)."""
    try:
        pidfd = os.pidfd_open(os.getpid())
    except (OSError, AttributeError) as exc:
        return (f"this host gives no pidfds (pidfd_open: {exc}), through which the agent signals and waits for a "
                "forked worker")
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except (OSError, AttributeError) as exc:
        return f"this host cannot signal through pidfds (pidfd_send_signal: {exc})"
    finally:
        os.close(pidfd)
    return None


class WorkerTemplate:
    """The agent's template process. `ready()` says whether it is warm; `fork(...)` gives a worker
    or None (start it fresh). Thread-safe: a reader thread records what the template says."""

    def __init__(self, env: dict[str, str], say: Callable[..., None], interpreter: str = sys.executable,
                 fork_timeout_s: float = FORK_TIMEOUT_S) -> None:
        """`env`: the environment of a worker before its own variables (what the template runs with).
        `say(kind, **fields)`: TEMPLATE_READY once warm, TEMPLATE_OFF once if it cannot be used."""
        self.env = env
        self.fork_timeout_s = fork_timeout_s
        self._say = say
        self._lock = threading.Condition()
        self._ready = False
        self._gone: str | None = None  # why the template cannot be used (said once)
        self._asks = 0
        self._answers: dict[int, dict] = {}
        self._codes: dict[int, int] = {}  # pid -> exit code, as reported
        self._forked: set[int] = set()
        self._abandoned: dict[int, str] = {}  # ask -> worker id: requests given up on (started fresh)
        unable = pidfd_problem()
        if unable is not None:
            self._gone = unable
            self._say(Kind.TEMPLATE_OFF, reason=unable)
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        try:
            self.proc = subprocess.Popen(
                dying_with_parent([interpreter, "-m", "ringmaster.worker.agent.starting.template_process"]),
                env={**env, CONTROL_FD_ENV: str(theirs.fileno())}, pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=sys.stdout.fileno(), stderr=sys.stderr.fileno())
        except OSError as exc:
            ours.close()
            self._gone = f"cannot start: {exc}"
            self._say(Kind.TEMPLATE_OFF, reason=self._gone)
            return
        finally:
            theirs.close()
        threading.Thread(target=self._read, daemon=True, name="ringmaster-template").start()

    def ready(self, timeout_s: float = 0.0) -> bool:
        """Whether the template is warm (waiting up to `timeout_s` for it, less if it fails)."""
        with self._lock:
            self._lock.wait_for(lambda: self._ready or self._gone is not None, timeout_s)
            return self._ready and self._gone is None

    @property
    def usable(self) -> bool:
        """Not failed (warm or still warming)."""
        return self._gone is None

    def fork(self, argv: list[str], env: dict[str, str], worker_id: str) -> tuple[ForkedProcess | None, str]:
        """(worker `worker_id` forked from the template, "") or (None, why it must start fresh)."""
        if not self.ready():
            return None, self._gone or "the template is not warm yet"
        assignment, why = spare_assignment(argv, env, os.getcwd(), self.env)
        if assignment is None:
            return None, why
        line = assignment.to_line()
        if len(line) > MAX_REQUEST_BYTES - 64:
            return None, f"its command and environment exceed {MAX_REQUEST_BYTES} bytes"
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        with self._lock:
            self._asks += 1
            ask = self._asks
        request = b'{"ask": %d, "argv": %s, "assignment": %s}' % (ask, json.dumps(argv).encode(), line.strip())
        try:
            socket.send_fds(self._sock, [request], [out_w, err_w])
        except OSError as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            if exc.errno in (errno.EMSGSIZE, errno.ENOBUFS):  # this request alone: the template stays
                return None, f"its command and environment ({len(request)} bytes) do not fit the template's socket"
            self._fail(f"cannot be asked for a worker: {exc}")
            return None, self._gone or ""
        finally:
            os.close(out_w)
            os.close(err_w)
        with self._lock:
            self._lock.wait_for(lambda: ask in self._answers or self._gone is not None, self.fork_timeout_s)
            answer = self._answers.pop(ask, None)
            if answer is not None and "pid" in answer:
                self._forked.add(answer["pid"])
        if answer is None or "pid" not in answer:
            for fd in (out_r, err_r):
                os.close(fd)
            if answer is None:
                with self._lock:
                    self._abandoned[ask] = worker_id  # (should it fork it after all, that process is killed)
                self._fail(f"did not fork a worker within {self.fork_timeout_s:g} s")
            elif answer.get("unsafe"):
                self._fail(str(answer.get("error")))
            return None, f"the template could not fork it ({(answer or {}).get('error', self._gone)})"
        return ForkedProcess(answer["pid"], os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"), self._ended), ""

    def _late(self, message: dict) -> tuple[str, int] | None:
        """(worker, pid) where `message` answers a request given up on with a process, which is
        killed here (that worker was started fresh); None for any other message."""
        with self._lock:
            ask = message.get("ask")
            if not isinstance(ask, int) or ask not in self._abandoned:
                return None
            worker = self._abandoned.pop(ask)
        pid = message.get("pid")
        if not isinstance(pid, int) or pid <= 0:
            return None
        try:
            os.kill(pid, signal.SIGKILL)  # (the template's child, not yet reaped by it: the pid is still its)
        except ProcessLookupError:
            pass
        return worker, pid

    def _ended(self, pid: int) -> int | None:
        with self._lock:
            code = self._codes.pop(pid, None)
            if code is not None:
                self._forked.discard(pid)
            elif self._gone is not None and pid in self._forked and not _alive(pid):
                self._forked.discard(pid)
                code = TEMPLATE_GONE_CODE
            return code

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                self._fail(f"ended (exit code {self.proc.wait()})")
                return
            try:
                message = json.loads(data)
            except ValueError:
                continue
            if message.get("ready"):
                self._say(Kind.TEMPLATE_READY, pid=self.proc.pid)
            elif message.get("ready") is False:
                self._fail(str(message.get("error", "not safe to fork from")))
                continue
            late = self._late(message)
            if late is not None:
                worker, pid = late
                self._say(Kind.TEMPLATE_LATE_FORK, worker=worker, pid=pid)
                continue
            with self._lock:
                if message.get("ready"):
                    self._ready = True
                elif "code" in message:
                    self._codes[int(message["pid"])] = int(message["code"])
                elif "ask" in message:
                    self._answers[int(message["ask"])] = message
                self._lock.notify_all()

    def _fail(self, why: str) -> None:
        with self._lock:
            if self._gone is not None:
                return
            self._gone = why
            self._lock.notify_all()
        self._say(Kind.TEMPLATE_OFF, reason=why)

    def close(self) -> None:
        """Stop the template (its forked workers die with it: stop them first)."""
        if self._gone is None:
            self._gone = "closed"
        sock = getattr(self, "_sock", None)  # (none where the template never started)
        try:
            if sock is not None:
                sock.close()
        except OSError:
            pass
        if getattr(self, "proc", None) is not None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def _alive(pid: int) -> bool:
    """Whether process `pid` is still there (not yet a zombie reaped by its template)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False
