"""Workload for the replica-group tests: HSDP with PyTorch's own FSDP2 on the generation's mesh.

Run with `ringmaster run --group-size K`. The state is a `hvd.elastic.ShardedState`: in each
generation it builds the model and its Adam optimizer on `hvd.elastic.mesh()` (("replicate",
"shard"): inside a group the parameters are sharded with `fully_shard`, across groups FSDP2
averages the gradients) and loads the committed shards into them, the newest commit the ring
holds whole. The script trains with a commit each step until rank 0 sees `--stop-file` (the
ranks agree on it through an allreduce, so they stop at the same step). A group's members train
on the same samples, the groups on different ones: an `ElasticSampler(by="group")` in the state
deals each epoch's samples to the groups, across failures and resizes.

Every worker appends JSON lines to `<log-dir>/<worker id>.jsonl`:
  {"event": "mesh", "generation", "rank", "size", "group", "groups", "group_rank", "shape", "dims", "step",
   "shard"}
      each time training (re-)enters, once the state is synced (`step`: the committed step it
      resumes at; `shard`: a SHA-256 of this worker's shards of the model and the optimizer state;
      `full`: of the whole model, gathered from its shards)
  {"event": "committing", "generation", "group_rank", "step", "shard"}   the state each commit takes,
      just before it (a commit's own collective may fail, so it is logged before)
  {"event": "epoch", "epoch", "min", "max"}   rank 0, at the end of each epoch: how often each
      sample reached the committed model (once a group); written before the commit that ends
      the epoch, so a rollback to its last step writes it again
  {"event": "first_step", "generation", "propagated"}   after the first step of each entry into training:
      how many sharding decisions DTensor worked out rather than found kept during it (a probe
      counting torch's uncached sharding propagation)
  {"event": "done", "rank", "size", "group", "step", "digest"}   when training returned; `digest`
      is a SHA-256 of the model's full parameters (gathered from their shards): equal digests
      across groups mean the replicas are identical

With `--hold-dir DIR`, the worker of rank `--hold-rank` in a generation that fails stays inside
its rollback until the writer of the FIFO DIR/hold closes it (it writes DIR/held first): the
tests' stand-in for a worker still inside a collective of the failed generation (a receive that
waits for its timeout).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import select
import time

import torch
import torch.nn as nn
from sharded_model import build, digest
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._sharding_prop import ShardingPropagator

import ringmaster.torch as hvd

#: Samples per group and step (each group's members train on the same ones: `by="group"`).
BATCH = 4


def local(value):
    return value.to_local() if isinstance(value, DTensor) else value


def shard_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 of this worker's own shards: the model's and the optimizer state's local tensors
    (computed here, independently of Ringmaster)."""
    sha = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        sha.update(name.encode())
        sha.update(local(value).detach().contiguous().numpy().tobytes())
    for index, entries in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(entries.items()):
            sha.update(f"{index}.{key}".encode())
            if isinstance(value, torch.Tensor):
                sha.update(local(value).detach().contiguous().numpy().tobytes())
    return sha.hexdigest()


#: Sharding decisions DTensor worked out in this process (not found in its cache).
PROPAGATED = [0]


def count_propagations() -> None:
    """A probe: count DTensor's uncached sharding propagations (torch's own method, wrapped)."""
    worked_out = ShardingPropagator.propagate_op_sharding_non_cached

    def counted(self, *args, **kwargs):
        PROPAGATED[0] += 1
        return worked_out(self, *args, **kwargs)

    setattr(ShardingPropagator, "propagate_op_sharding_non_cached", counted)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=pathlib.Path, required=True)
    parser.add_argument("--stop-file", type=pathlib.Path, required=True)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--hold-dir", type=pathlib.Path)
    parser.add_argument("--hold-rank", type=int, default=-1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    count_propagations()
    hvd.init()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    log = open(args.log_dir / f"{os.environ['RINGMASTER_WORKER_ID'].replace('/', '_')}.jsonl", "a", buffering=1)

    def write(event: str, **fields) -> None:
        log.write(json.dumps({"event": event, **fields}) + "\n")

    features = torch.randn(args.samples, 32, generator=torch.Generator().manual_seed(0))
    dataset = torch.utils.data.TensorDataset(torch.arange(args.samples), features)
    sampler = hvd.elastic.ElasticSampler(dataset, by="group")
    class HeldState(hvd.elastic.ShardedState):
        def restore(self) -> None:
            hold = args.hold_dir / "hold" if args.hold_dir else None
            if hold is not None and hold.exists() and hvd.rank() == args.hold_rank:
                # the test holds the write end of the FIFO `hold` open: its close (EOF here) releases
                fifo = os.open(hold, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    (args.hold_dir / "held").write_text(os.environ["RINGMASTER_WORKER_ID"])
                    released, _, _ = select.select([fifo], [], [], 300)
                    assert released, "held past 300 s"
                finally:
                    os.close(fifo)
            super().restore()

    state = HeldState(build, step=0, epoch=0, sampler=sampler, seen=torch.zeros(args.samples))

    @hvd.elastic.run
    def train(state) -> str:
        mesh = hvd.elastic.mesh()
        group = hvd.elastic.replica_group()
        model, optimizer = state.model, state.optimizer
        generation = hvd.context().assignment.generation if hvd.context().assignment else 0
        write("mesh", generation=generation, rank=hvd.rank(), size=hvd.size(), group=group.index, groups=group.count,
              group_rank=group.rank, shape=list(mesh.shape), dims=list(mesh.mesh_dim_names or ()), step=state.step,
              shard=shard_digest(model, optimizer), full=digest(model))
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=state.sampler)
        stepped: list[bool] = []
        while True:
            for batch_idx, (index, x) in enumerate(loader):
                stop = torch.tensor([1.0 if hvd.rank() == 0 and args.stop_file.exists() else 0.0])
                if hvd.allreduce(stop, op=hvd.Max).item():
                    return digest(model)
                propagated = PROPAGATED[0]
                loss = model(x).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if not stepped:
                    write("first_step", generation=generation, propagated=PROPAGATED[0] - propagated)
                    stepped.append(True)
                counts = torch.zeros(args.samples)
                if group.rank == 0:  # (a group's members all train on its samples: counted once a group)
                    counts[index] += 1
                state.seen += hvd.allreduce(counts, op=hvd.Sum)
                time.sleep(args.step_time)
                state.step += 1
                state.sampler.record_batch(batch_idx, BATCH)
                hvd.report(loss=loss)
                write("committing", generation=generation, group_rank=group.rank, step=state.step,
                      shard=shard_digest(model, optimizer))
                state.commit()
            if hvd.rank() == 0:
                write("epoch", epoch=state.epoch, min=float(state.seen.min()), max=float(state.seen.max()))
            state.epoch += 1
            state.seen = torch.zeros(args.samples)
            state.sampler.set_epoch(state.epoch)
            state.commit()

    final = train(state)
    group = hvd.elastic.replica_group()
    write("done", rank=hvd.rank(), size=hvd.size(), group=group.index, step=state.step, digest=final)


if __name__ == "__main__":
    main()
