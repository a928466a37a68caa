"""A training script that tries to act as its agent, as another host's agent and as another
worker, with everything its environment and /proc give it; then trains as a good one.

Writes <out>/<worker id with / as _>.json: what it found it holds, and the gRPC status of every
attempt. Run by tests/e2e/test_trust.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import grpc
import torch

import ringmaster.torch as hvd
from ringmaster.common.grpc_auth import Credentials, secured
from ringmaster.common.keys import AGENT, WORKER, WORKER_KEY_ENV, Identity
from ringmaster.proto import environment as env_names
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc


def holds(environ_text: str) -> list[str]:
    """Which secrets an environment block holds (by name)."""
    return sorted(name for name in ("RINGMASTER_SECRET", "RINGMASTER_AGENT_KEY")
                  if f"{name}=" in environ_text)


def attempt(address: str, credentials: Credentials, call) -> str:
    """The status code a call ends with (OK when it went through)."""
    with secured(grpc.insecure_channel(address), credentials) as channel:
        stub = pb_grpc.RendezvousStub(channel)
        try:
            call(stub)
            return "OK"
        except grpc.RpcError as exc:
            return exc.code().name


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    me, host = os.environ[env_names.WORKER_ID], os.environ[env_names.HOST]
    address = os.environ[env_names.RENDEZVOUS].split(",")[0]
    key = bytes.fromhex(os.environ[WORKER_KEY_ENV])
    other_host = "hostB" if host == "hostA" else "hostA"
    other = "hostB/2" if host == "hostA" else "hostA/1"  # the other worker of `-H hostA:1,hostB:1`
    with open(f"/proc/{os.getppid()}/environ", "rb") as f:  # the agent's environment, as /proc shows it
        agent_environ = f.read().decode(errors="replace").replace("\0", "\n")
    found = {"own_environment": holds("\n".join(f"{k}={v}" for k, v in os.environ.items())),
             "agent_environment": holds(agent_environ)}
    mine = Credentials(Identity(WORKER, host, me), key)
    hello = pb.AgentHello(host=host, pid=os.getppid(), incarnation="x")

    def session(stub) -> None:
        next(iter(stub.AgentSession(hello, timeout=10)))

    attempts = {
        # its own key, as what it is not
        "agent session for its host": attempt(address, mine, session),
        "exit of another host's worker": attempt(address, mine, lambda s: s.ReportWorkerExit(
            pb.WorkerExit(host=other_host, worker_id=other, exit_code=1), timeout=10)),
        "ready for another worker": attempt(address, mine, lambda s: s.Ready(
            pb.ReadyRequest(worker_id=other, failure="forged"), timeout=10)),
        "readies carried for another worker": attempt(address, mine, lambda s: s.CarryReady(pb.CarriedReady(
            host=host, ready=[pb.ReadyRequest(worker_id=other, failure="forged")]), timeout=10)),
        "done for another worker": attempt(address, mine, lambda s: s.ReportDone(
            pb.DoneRequest(worker_id=other), timeout=10)),
        # its own key, claiming to be its agent or another worker
        "its key as its agent": attempt(address, Credentials(Identity(AGENT, host), key), session),
        "its key as another host's agent": attempt(address, Credentials(Identity(AGENT, other_host), key), lambda s: (
            s.ReportWorkerExit(pb.WorkerExit(host=other_host, worker_id=other, exit_code=1), timeout=10))),
        "its key as another worker": attempt(address, Credentials(Identity(WORKER, other_host, other), key),
                                             lambda s: s.Ready(pb.ReadyRequest(worker_id=other, failure="forged"),
                                                               timeout=10)),
        # the control: its own call goes through
        "its own heartbeat": attempt(address, mine, lambda s: s.WorkerHeartbeat(
            pb.WorkerHeartbeatRequest(worker_id=me), timeout=10)),
    }
    hvd.init()
    total = hvd.allreduce(torch.ones(4), op=hvd.Sum)  # then a good member of the ring
    (out / f"{me.replace('/', '_')}.json").write_text(json.dumps(
        {"found": found, "attempts": attempts, "sum": total.tolist(), "size": hvd.size()}))


if __name__ == "__main__":
    main()
