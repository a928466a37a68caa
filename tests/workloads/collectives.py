"""Checks the Horovod API's collectives on a real ring; writes what it saw to <out>/<rank>.json."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import torch

import ringmaster.torch as hvd


def check_state_sync(rank: int) -> dict:
    """Align snapshots with the newest commit (rank 0's, or the rank's with the most commits) in
    five situations; report what moved, from where, and what arrived."""
    from ringmaster.checkpoint.memory import HostSnapshot
    from ringmaster.worker.train.state_sync import sync_snapshot

    comm = hvd.context().communicator()
    seen: dict = {}

    def run(name: str, entries: dict, commits: int = 0) -> None:
        snapshot = HostSnapshot()
        snapshot.capture(entries)
        plan = sync_snapshot(snapshot, comm, hvd.broadcast_object, commits=commits)
        tree = snapshot.export()
        seen[name] = {"skeleton_to": list(plan.skeleton_to), "tensors_to": list(plan.tensors_to), "root": plan.root,
                      "w": tree["model"]["w"].tolist(), "epoch": tree["epoch"],
                      "optimizer": sorted(tree["optimizer"]["state"])}

    same = {"model": {"w": torch.arange(4.0)}, "epoch": 3, "optimizer": {"state": {0: torch.ones(2)}}}
    run("all-equal", same)  # survivors after a rollback: nothing moves
    newcomer = {"model": {"w": torch.zeros(4)}, "epoch": 0, "optimizer": {"state": {}}}  # other layout
    run("one-newcomer", newcomer if rank == 2 else same)
    run("objects-only", dict(same, epoch=rank + 10))  # same tensors, other objects
    run("all-differ", {"model": {"w": torch.full((4,), float(rank))}, "epoch": rank,
                       "optimizer": {"state": {rank: torch.ones(1)}}})
    # Rank 0 holds an old commit (a worker back from a ring it left long ago), rank 1 the newest:
    # rank 1's goes everywhere, rank 0's is never handed out.
    older = {"model": {"w": torch.full((4,), 5.0)}, "epoch": 1, "optimizer": {"state": {0: torch.ones(2)}}}
    run("newest-not-rank-0", same if rank == 1 else older, commits={0: 5, 1: 9, 2: 5}[rank])
    return seen


def check_buckets(rank: int, size: int) -> dict:
    """Gradients reduced in buckets while backward runs (a tiny fusion threshold: several
    buckets), checked against a plain average of every gradient; an unused branch's parameters
    count as zeros; gradient_predivide_factor changes nothing but the order of the scaling; fp16
    and bf16 compression reduce to the average within their precision."""
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "64"  # bytes: each layer's weight is a bucket of its own
    torch.manual_seed(0)
    # Buckets follow the reverse order of the parameters: the unused branch, declared first, is
    # in the last bucket, which goes out at step(); the body's buckets go out during backward.
    model = torch.nn.ModuleDict({"unused": torch.nn.Linear(2, 2),
                                 "body": torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                                             torch.nn.Linear(8, 2))})
    seen: dict = {}
    for predivide, compression in ((1.0, "none"), (2.0, "none"), (1.0, "fp16"), (1.0, "bf16")):
        optimizer: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                                  named_parameters=model.named_parameters(),
                                                  gradient_predivide_factor=predivide,
                                                  compression=getattr(hvd.Compression, compression))
        optimizer.zero_grad()
        x = torch.full((3, 4), float(rank + 1))
        model["body"](x).pow(2).sum().backward()
        seen.setdefault("buckets", len(optimizer._hvd_buckets.buckets))
        seen.setdefault("in_flight_after_backward", optimizer._hvd_buckets.in_flight)
        local = {n: p.grad.clone() for n, p in model["body"].named_parameters()}
        expected = {n: hvd.allreduce(g) for n, g in local.items()}  # after the buckets, on every rank
        optimizer.step()
        tolerance = {"none": 1e-6, "fp16": 1e-3, "bf16": 1e-2}[compression]
        seen[f"matches_{predivide:g}_{compression}"] = all(
            torch.allclose(p.grad, expected[n], rtol=tolerance,
                           atol=tolerance) for n, p in model["body"].named_parameters())
        seen["unused_grads"] = [p.grad.abs().sum().item() for p in model["unused"].parameters()]
    del os.environ["HOROVOD_FUSION_THRESHOLD"]
    return seen


def check_bucket_order(rank: int) -> dict:
    """Ranks whose gradients become ready in different orders (rank 0 runs the side branch
    last, the others first) all rebuild their buckets in rank 0's order after the first step,
    and keep reducing to the plain average."""
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"  # one tensor per bucket: the order shows
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"head": torch.nn.Linear(4, 2), "body": torch.nn.Linear(3, 4),
                                 "side": torch.nn.Linear(3, 2)})
    names = [n for n, _ in model.named_parameters()]
    optimizer: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                              named_parameters=model.named_parameters())
    seen: dict = {"before": [names[i] for i in optimizer._hvd_buckets.order]}
    x = torch.full((3, 3), float(rank + 1))
    for step in range(3):
        optimizer.zero_grad()
        if rank == 0:
            out = model["head"](model["body"](x)) + model["side"](x)  # side's gradients come first
        else:
            out = model["side"](x) + model["head"](model["body"](x))  # side's come last
        out.pow(2).sum().backward()
        local = {n: p.grad.clone() for n, p in model.named_parameters()}
        expected = {n: hvd.allreduce(g) for n, g in local.items()}
        optimizer.step()
        seen[f"matches_{step}"] = all(torch.allclose(p.grad, expected[n], atol=1e-6)
                                      for n, p in model.named_parameters())
        seen[f"order_{step}"] = [names[i] for i in optimizer._hvd_buckets.order]
    del os.environ["HOROVOD_FUSION_THRESHOLD"]
    return seen


def check_cuda_buckets(rank: int) -> bool:
    """The same bucketed reduction on CUDA tensors (NCCL ring): equal to a plain average."""
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "4096"
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
    optimizer: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                              named_parameters=model.named_parameters())
    optimizer.zero_grad()
    model(torch.full((4, 64), float(rank + 1), device="cuda")).pow(2).sum().backward()
    expected = [hvd.allreduce(p.grad.clone()) for p in model.parameters()]
    optimizer.step()
    del os.environ["HOROVOD_FUSION_THRESHOLD"]
    return all(torch.allclose(p.grad, e, atol=1e-5) for p, e in zip(model.parameters(), expected))


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
    # 6 MB of float32 summed straight into new tensors around the ring of point-to-point transfers
    big = torch.arange(1_500_001, dtype=torch.float32) * (rank + 1)
    summed = hvd.allreduce(big, op=hvd.Sum, postscale_factor=0.5)
    result["big_ring_used"] = hvd.context().communicator()._ring_sum is not None
    averaged = hvd.allreduce(big, prescale_factor=2.0)
    expected = torch.arange(1_500_001, dtype=torch.float64) * (size * (size + 1) / 2)
    result["big_sum_error"] = float((summed.double() - expected * 0.5).abs().max())
    result["big_average_error"] = float(
        ((averaged.double() - expected * 2.0 / size) / expected.clamp(min=1)).abs().max()
    )
    result["big_digest"] = hashlib.sha256(summed.numpy().tobytes() + averaged.numpy().tobytes()).hexdigest()
    result["big_untouched"] = torch.equal(big, torch.arange(1_500_001, dtype=torch.float32) * (rank + 1))
    # 600 KB of float16 / bfloat16: summed around the half-precision ring of point-to-point transfers
    result["half_sum"] = sorted(set(hvd.allreduce(torch.full((300_001,), rank + 1.0, dtype=torch.float16),
                                                  op=hvd.Sum).tolist()))
    result["bf16_average"] = sorted(set(hvd.allreduce(torch.full((300_001,), rank + 1.0,
                                                                 dtype=torch.bfloat16)).tolist()))
    result["allgather"] = hvd.allgather(torch.full((rank + 1, 2), rank)).tolist()
    result["broadcast"] = hvd.broadcast(torch.tensor([rank * 10.0]), root_rank=size - 1).tolist()
    result["object"] = hvd.broadcast_object({"from": rank, "text": "hi"}, root_rank=0)
    result["gathered_objects"] = hvd.allgather_object(rank * 2)

    torch.manual_seed(rank)  # different weights per rank, made equal by broadcast_parameters
    model = torch.nn.Linear(3, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                         named_parameters=model.named_parameters())
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
    result["buckets"] = check_buckets(rank, size)
    result["bucket_order"] = check_bucket_order(rank)
    result["grouped"] = [t.tolist() for t in hvd.grouped_allreduce([torch.tensor([float(rank)]),
                                                                    torch.tensor([rank, 1])],
                                                                    op=hvd.Sum)]
    result["sync"] = check_state_sync(rank)
    if "--cuda" in sys.argv:
        result["cuda_sum"] = hvd.allreduce(torch.tensor([float(rank + 1)], device="cuda"), op=hvd.Sum).cpu().tolist()
        result["cuda_buckets"] = check_cuda_buckets(rank)
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
