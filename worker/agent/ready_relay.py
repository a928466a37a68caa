"""The agent's side of carried `Ready`s (see `ringmaster/common/beat_relay.py`).

A membership change of a large job asks a `Ready` of every member (a host update interrupts them
all at one commit): one call per worker, 32,768 at 4,096 hosts x 8, each a fraction of a
millisecond of the rendezvous' one process. While the agent relays its workers' beats, a worker
sends its `Ready` to the agent's socket instead (`READY_SOCKET`, beside the beats'), and the agent
carries those that came together in one call (`CarryReady`): it sends as soon as every worker it
runs has asked, or `GATHER_S` after the first (a host's workers reach the same commit within
milliseconds: they train in lock step).

Who sent one is the kernel's word (`SCM_CREDENTIALS`), never the request's. A refusal is logged:
the rendezvous refuses the `Ready` of a worker it counted failed or that is leaving, and stops or
retires that worker on its own. A call that does not go through is not retried: the worker's
next session says what it waits for (its hello), as after its own `Ready` lost to a rendezvous
that went away.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import grpc

from ringmaster.common.beat_relay import MAX_READY_BYTES, READY_SOCKET
from ringmaster.common.peer_credentials import receive
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.settings import EXIT_REPORT_RPC_TIMEOUT_S
from ringmaster.worker.agent.beat_relay import worker_message, workers_socket

#: Seconds the first `Ready` of a batch waits for the host's others (unless all came sooner).
GATHER_S = 0.02
#: Seconds a carrying call may take (as an exit report's: the agent's stop waits for the last one).
CARRY_RPC_TIMEOUT_S = EXIT_REPORT_RPC_TIMEOUT_S


class ReadyCarrier:
    """Receives the workers' `Ready`s in `folder` and carries each batch for `host` on the
    agent's current session (`stub()`; none: not carried), on its own thread; `worker_of(pid)`
    names the worker a process is (None: not ours), `running()` how many workers the agent runs
    now, `refused(worker, reason)` says a refusal."""

    def __init__(self, folder: str, host: str, worker_of: Callable[[int], str | None], running: Callable[[], int],
                 stub: Callable[[], Any], refused: Callable[[str, str], None]) -> None:
        self.host, self._worker_of, self._running, self._stub, self._refused = host, worker_of, running, stub, refused
        self._out: threading.Thread | None = None
        self._cond = threading.Condition()
        self._pending: dict[str, pb.ReadyRequest] = {}  # (a worker's newest only)
        self._first_at = 0.0
        self._closed = False
        self.refused = 0  # datagrams dropped: not from one of our workers, too large, not a Ready
        self._sock = workers_socket(os.path.join(folder, READY_SOCKET)) if folder else None
        if self._sock is not None:  # (else the workers call themselves)
            threading.Thread(target=receive, args=(self._sock, MAX_READY_BYTES, self._take, self._refuse),
                             daemon=True, name="ready-in").start()
            self._out = threading.Thread(target=self._carry, daemon=True, name="ready-out")
            self._out.start()

    def close(self) -> None:
        """Stop, and wait for a call under way (the agent closes the channel next: closing it under
        a call can deadlock the process)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if self._out is not None:
            self._out.join(CARRY_RPC_TIMEOUT_S + 1.0)

    def _refuse(self) -> None:
        self.refused += 1

    def _take(self, data: bytes, sender: tuple[int, int] | None) -> bool:
        """A datagram from a worker this agent started (by the kernel's word) that is a `Ready`."""
        found = worker_message(data, sender, self._worker_of, pb.ReadyRequest)
        if found is None:
            return False
        worker_id, ready = found
        ready.worker_id = worker_id  # (who sent it is the kernel's word, not the datagram's)
        with self._cond:
            if not self._pending:
                self._first_at = time.monotonic()
            self._pending[worker_id] = ready
            self._cond.notify_all()
        return True

    def _carry(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._batch_due():
                    wait = GATHER_S - (time.monotonic() - self._first_at) if self._pending else None
                    self._cond.wait(wait)
                if self._closed:
                    return
                batch, self._pending = list(self._pending.values()), {}
            self._send(batch)

    def _send(self, batch: list[pb.ReadyRequest]) -> None:
        stub = self._stub()
        if stub is None:
            return  # (the workers' next sessions say what they wait for)
        try:
            answer = stub.CarryReady(pb.CarriedReady(host=self.host, ready=batch), timeout=CARRY_RPC_TIMEOUT_S)
        except (grpc.RpcError, ValueError):
            return  # (as above; ValueError: its channel closed)
        for refused in answer.refused:
            self._refused(refused.worker_id[:200], refused.reason[:2000])

    def _batch_due(self) -> bool:
        """Whether the pending `Ready`s go now: every worker asked, or the first waited GATHER_S."""
        return bool(self._pending) and (len(self._pending) >= self._running()
                                        or time.monotonic() - self._first_at >= GATHER_S)
