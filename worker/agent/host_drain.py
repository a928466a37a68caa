"""An agent's drain of its own host: asked by a stop signal (the agent leaves once its workers
have left at a commit, or the grace is over) or by a preemption notice (the agent stays). The
asks go to the rendezvous in order (`DrainHost`); those it cannot hear now wait for the next
session."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import grpc

from ringmaster.common.dial import AWAY_CODES
from ringmaster.common.events import Kind
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.settings import EXIT_REPORT_RPC_TIMEOUT_S


@dataclass(frozen=True)
class DrainAsk:
    """Put on the agent's command queue: drain this host (`deadline_s`), or withdraw a notice."""

    reason: str
    deadline_s: float
    notice: bool = False  # a preemption notice: the agent stays; else the agent leaves with the drain
    withdraw: bool = False


class HostDrain:
    def __init__(self, host: str, grace_s: float, say: Callable[..., None]) -> None:
        """`say(kind, **fields)` tells the agent's events; `grace_s`: --drain-grace."""
        self.host, self.grace_s, self.say = host, grace_s, say
        self.leaving_by: float | None = None  # draining to leave: stop by then at the latest
        self._unsent: list[DrainAsk] = []  # asks not yet delivered (rendezvous away)

    def begin(self, ask: DrainAsk, workers: int, stub: pb_grpc.RendezvousStub | None) -> bool:
        """Act on a drain ask while running `workers`; False when the agent should stop now
        (nothing to drain)."""
        if ask.notice:
            self.say(Kind.AGENT_NOTICE, notice=ask.reason)
        else:
            if not workers:
                self.say(Kind.AGENT_STOPPING, reason=f"{ask.reason}: no workers to drain")
                return False
            if self.leaving_by is None:
                self.leaving_by = time.monotonic() + ask.deadline_s
                self.say(Kind.AGENT_DRAINING, why=ask.reason, grace_s=ask.deadline_s, workers=workers)
        self._unsent.append(ask)
        self.send(stub)
        return True

    def send(self, stub: pb_grpc.RendezvousStub | None) -> None:
        """Deliver the drain asks in order; those the rendezvous cannot hear now wait."""
        while self._unsent and stub is not None:
            ask = self._unsent[0]
            try:
                stub.DrainHost(pb.DrainRequest(host=self.host, deadline_s=ask.deadline_s, reason=ask.reason[:200],
                                               notice=ask.notice, withdraw=ask.withdraw),
                               timeout=EXIT_REPORT_RPC_TIMEOUT_S)
            except ValueError:  # the channel closed meanwhile
                return
            except grpc.RpcError as exc:
                if exc.code() in AWAY_CODES:
                    return
                self.say(Kind.AGENT_DRAIN_REFUSED, error=exc.details())
            self._unsent.pop(0)

    def left(self, workers: int, exits_unsent: bool) -> bool:
        """Leaving and done: every worker gone and reported, or the grace over (the rest are
        stopped). False while not leaving."""
        if self.leaving_by is None:
            return False
        if not workers and not exits_unsent:
            self.say(Kind.AGENT_STOPPING, reason="host drained: its workers left at a commit")
            return True
        if time.monotonic() >= self.leaving_by:
            self.say(Kind.AGENT_STOPPING, reason=f"the drain grace ({self.grace_s:g} s) is over: "
                                                 f"stopping {workers} worker(s)")
            return True
        return False
