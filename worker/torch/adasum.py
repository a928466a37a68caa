"""Horovod's Adasum reduction (`op=hvd.Adasum`): combine updates so that parallel ones add and
parallel-and-equal ones average, which lets the learning rate stay that of one worker.

For two vectors a and b, Adasum is

    (1 - a.b / (2 |a|^2)) a  +  (1 - a.b / (2 |b|^2)) b

(a coefficient is 1 when its vector is zero). Ranks are combined pairwise up a binary tree in
rank order, as Horovod's recursive doubling pairs them; each tensor is combined on its own, as
Horovod does per layer. Here every rank gathers every rank's tensor and computes the same tree
in the same order, so all ranks get bitwise-equal results; the price is a gather of
world-size copies, which is fine for the CPU path this serves (Horovod's own fast Adasum paths
need MPI or NCCL builds).
"""

from __future__ import annotations

from typing import Sequence

import torch

#: Below this squared norm a vector counts as zero (its coefficient is 1), as in Horovod.
_ZERO_NORM_SQ = 1e-30


def combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two tensors of one shape, computed in float64 for the dot products."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    dot = torch.dot(a64, b64)
    a_sq, b_sq = torch.dot(a64, a64), torch.dot(b64, b64)
    a_coeff = 1.0 - dot / (2.0 * a_sq) if a_sq >= _ZERO_NORM_SQ else torch.tensor(1.0, dtype=torch.float64)
    b_coeff = 1.0 - dot / (2.0 * b_sq) if b_sq >= _ZERO_NORM_SQ else torch.tensor(1.0, dtype=torch.float64)
    return (a_coeff * a64 + b_coeff * b64).reshape(a.shape).to(a.dtype)


def tree(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Combine rank-ordered tensors pairwise, level by level (an odd one out moves up as is)."""
    if not parts:
        raise ValueError("Adasum needs at least one tensor")
    level = list(parts)
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def reduce_slices(gathered: Sequence[torch.Tensor], sizes: Sequence[int]) -> torch.Tensor:
    """Adasum of flat buffers (one per rank, each the concatenation of tensors of `sizes`
    elements), each tensor's slice combined on its own; returns the reduced flat buffer."""
    out = torch.empty_like(gathered[0])
    offset = 0
    for n in sizes:
        out[offset: offset + n] = tree([part[offset: offset + n] for part in gathered])
        offset += n
    return out
