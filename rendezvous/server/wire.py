"""The coordinator's effects as protobuf messages: the only place that knows both."""

from __future__ import annotations

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.rendezvous.control.effects import (
    AgentEffect, Assign, EndGeneration, EndJob, Retire, StopAgent, UpdateHosts, WorkerEffect,
)


def agent_command(effect: AgentEffect) -> pb.AgentCommand:
    if isinstance(effect, StopAgent):
        return pb.AgentCommand(shutdown=True, reason=effect.reason)
    return pb.AgentCommand(workers=[
        pb.WorkerSpec(worker_id=w.worker_id, slot=w.slot, argv=list(w.argv), env=dict(w.env)) for w in effect.workers
    ])


def worker_event(effect: WorkerEffect) -> pb.WorkerEvent:
    if isinstance(effect, Assign):
        a = effect.place
        return pb.WorkerEvent(assignment=pb.Assignment(
            generation=effect.generation, rank=a.rank, size=a.size, local_rank=a.local_rank,
            local_size=a.local_size, cross_rank=a.cross_rank, cross_size=a.cross_size,
            store_host=effect.store_host, store_port=effect.store_port, store_prefix=effect.store_prefix,
            hosts_sequence=effect.hosts_sequence,
        ))
    if isinstance(effect, EndGeneration):
        return pb.WorkerEvent(generation_over=pb.GenerationOver(generation=effect.generation, reason=effect.reason))
    if isinstance(effect, UpdateHosts):
        return pb.WorkerEvent(hosts_updated=pb.HostsUpdated(sequence=effect.sequence, reason=effect.reason,
                                                                  checkpoint=effect.checkpoint))
    if isinstance(effect, Retire):
        return pb.WorkerEvent(retire=pb.Retire(reason=effect.reason))
    if isinstance(effect, EndJob):
        return pb.WorkerEvent(job_ended=pb.JobEnded(success=effect.success, reason=effect.reason))
    raise TypeError(f"not a worker effect: {effect!r}")
