"""A plain torchrun + FSDP2 script, no Ringmaster: load a ShardedState's DCP checkpoint and go on.

Run with `torchrun --standalone --nproc-per-node N plain_fsdp2_load.py CHECKPOINT OUT.json`. It
builds the replica-group workload's model and Adam optimizer, sharded with `fully_shard` on a
1-D mesh of all its ranks, loads `{"model", "optimizer"}` of the checkpoint with DCP's own
`dcp.load` and `set_state_dict` (resharded onto this mesh), takes one training step and writes
`{"digest": SHA-256 of the whole loaded model, "adam_steps": Adam's step count loaded, "loss_before",
"loss_after"}` from rank 0.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from sharded_model import build, digest
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh


def main() -> None:
    checkpoint, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    objects = build(mesh)
    model, optimizer = objects["model"], objects["optimizer"]
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=checkpoint)  # (loads into these, in place)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    loaded = digest(model)
    adam_steps = float(next(iter(optimizer.state.values()))["step"])
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(7))
    before = model(x).square().mean()
    before.backward()
    optimizer.step()
    optimizer.zero_grad()
    after = model(x).square().mean()
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"digest": loaded, "adam_steps": adam_steps, "loss_before": float(before),
                       "loss_after": float(after)}, f)
    dist.barrier()  # (no rank tears Gloo down while a peer is still in a collective)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
