"""The replica-group workloads' model, shared by the Ringmaster script and the plain FSDP2 one
(no Ringmaster here): built and sharded the same way by both, so a checkpoint moves between them."""

from __future__ import annotations

import hashlib

import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def build(mesh) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.01)}


def digest(model: nn.Module) -> str:
    full = [(name, value.full_tensor()) for name, value in sorted(model.state_dict().items())]
    sha = hashlib.sha256()
    for name, tensor in full:
        sha.update(name.encode())
        sha.update(tensor.detach().contiguous().numpy().tobytes())
    return sha.hexdigest()
