"""The exits of an agent's workers, reported to the rendezvous in order; what cannot be sent now
(the rendezvous away) waits for the next session. Once the rendezvous told the agent to stop (the
job ended, or the host counts as lost), the exits of the workers it stops are nobody's news."""

from __future__ import annotations

from typing import Callable

import grpc

from ringmaster.common.dial import AWAY_CODES
from ringmaster.common.events import Kind
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.settings import EXIT_REPORT_RPC_TIMEOUT_S


class ExitReports:
    def __init__(self, say: Callable[..., None]) -> None:
        self.say = say
        self.unsent: list[pb.WorkerExit] = []  # exits not yet reported (rendezvous away)
        self.nobodys_news = False  # told to stop: nothing more is reported

    def add(self, exit_: pb.WorkerExit) -> None:
        self.unsent.append(exit_)

    def send(self, stub: pb_grpc.RendezvousStub | None) -> None:
        if self.nobodys_news:
            self.unsent.clear()
            return
        while self.unsent and stub is not None:
            try:
                stub.ReportWorkerExit(self.unsent[0], timeout=EXIT_REPORT_RPC_TIMEOUT_S)
            except ValueError:  # the channel closed meanwhile
                return
            except grpc.RpcError as exc:
                if exc.code() in AWAY_CODES:
                    return  # sent again once a session is back
                self.say(Kind.AGENT_REPORT_REFUSED, worker=self.unsent[0].worker_id, error=exc.details())
            self.unsent.pop(0)
