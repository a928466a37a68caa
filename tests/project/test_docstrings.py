"""The user API and the wire protocol say what they do: every public function of
`ringmaster.torch` (and `ringmaster.torch.elastic`) and every RPC handler has a docstring."""

from __future__ import annotations

import inspect

import ringmaster.torch as hvd
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.rendezvous.server.grpc_service import RendezvousService


def _undocumented(module) -> list[str]:
    missing = []
    for name in module.__all__:  # what the module offers, not what it imported for itself
        obj = getattr(module, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            missing += [f"{name}.{m}" for m, member in vars(obj).items()
                        if not m.startswith("_") and inspect.isfunction(member) and not inspect.getdoc(member)]
    return missing


def test_every_public_function_of_the_user_api_has_a_docstring() -> None:
    assert _undocumented(hvd) == []
    assert _undocumented(hvd.elastic) == []
    for name in ("rank", "size", "broadcast", "barrier", "allreduce", "DistributedOptimizer"):
        assert inspect.getdoc(getattr(hvd, name)), name


def test_every_rpc_has_a_docstring() -> None:
    rpcs = [m for m in vars(pb_grpc.RendezvousServicer) if not m.startswith("_")]
    assert len(rpcs) >= 7
    assert [m for m in rpcs if not inspect.getdoc(vars(RendezvousService)[m])] == []
