"""Checks the Horovod API's collectives on a real ring; writes what it saw to <out>/<rank>.json."""

from __future__ import annotations

import json
import os
import sys

import torch

import ringmaster.torch as hvd


def check_state_sync(rank: int) -> dict:
    """Align snapshots with rank 0's in three situations; report what moved and what arrived."""
    from ringmaster.checkpoint.memory import HostSnapshot
    from ringmaster.worker.train.state_sync import sync_snapshot

    comm = hvd.context().communicator()
    seen: dict = {}

    def run(name: str, entries: dict) -> None:
        snapshot = HostSnapshot()
        snapshot.capture(entries)
        plan = sync_snapshot(snapshot, comm, hvd.broadcast_object)
        tree = snapshot.export()
        seen[name] = {"skeleton_to": list(plan.skeleton_to), "tensors_to": list(plan.tensors_to),
                      "w": tree["model"]["w"].tolist(), "epoch": tree["epoch"],
                      "optimizer": sorted(tree["optimizer"]["state"])}

    same = {"model": {"w": torch.arange(4.0)}, "epoch": 3, "optimizer": {"state": {0: torch.ones(2)}}}
    run("all-equal", same)  # survivors after a rollback: nothing moves
    newcomer = {"model": {"w": torch.zeros(4)}, "epoch": 0, "optimizer": {"state": {}}}  # other layout
    run("one-newcomer", newcomer if rank == 2 else same)
    run("objects-only", dict(same, epoch=rank + 10))  # same tensors, other objects
    run("all-differ", {"model": {"w": torch.full((4,), float(rank))}, "epoch": rank, "optimizer": {"state": {rank: torch.ones(1)}}})
    return seen


def main() -> None:
    out = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    result: dict = {"rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
                    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size()}
    value = torch.tensor([float(rank + 1), 2.0 * (rank + 1)])
    result["average"] = hvd.allreduce(value).tolist()
    result["sum"] = hvd.allreduce(value, op=hvd.Sum).tolist()
    result["max"] = hvd.allreduce(value, op=hvd.Max).tolist()
    result["adasum"] = hvd.allreduce(value, op=hvd.Adasum).tolist()
    result["input_untouched"] = value.tolist()
    result["allgather"] = hvd.allgather(torch.full((rank + 1, 2), rank)).tolist()
    result["broadcast"] = hvd.broadcast(torch.tensor([rank * 10.0]), root_rank=size - 1).tolist()
    result["object"] = hvd.broadcast_object({"from": rank, "text": "hi"}, root_rank=0)
    result["gathered_objects"] = hvd.allgather_object(rank * 2)

    torch.manual_seed(rank)  # different weights per rank, made equal by broadcast_parameters
    model = torch.nn.Linear(3, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    before = model.weight.detach().clone()
    x = torch.full((1, 3), float(rank + 1))
    model(x).sum().backward()
    optimizer.step()
    result["weight_delta"] = (before - model.weight.detach()).tolist()
    result["weights"] = model.weight.detach().tolist()

    # backward_passes_per_step=2: two backward passes, one reduction at step()
    accumulate = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                          named_parameters=model.named_parameters(), backward_passes_per_step=2)
    accumulate.zero_grad()
    before = model.weight.detach().clone()
    model(x).sum().backward()
    model(x).sum().backward()
    accumulate.step()
    result["accumulated_delta"] = (before - model.weight.detach()).tolist()

    # op=hvd.Adasum: local steps, then the parameter deltas combined with Adasum
    adasum = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                      named_parameters=model.named_parameters(), op=hvd.Adasum)
    adasum.zero_grad()
    before = model.weight.detach().clone()
    model(x).sum().backward()
    adasum.step()
    result["adasum_delta"] = (before - model.weight.detach()).tolist()
    result["adasum_weights"] = model.weight.detach().tolist()
    result["sync"] = check_state_sync(rank)
    if "--cuda" in sys.argv:
        result["cuda_sum"] = hvd.allreduce(torch.tensor([float(rank + 1)], device="cuda"), op=hvd.Sum).cpu().tolist()
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
