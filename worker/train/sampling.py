"""Which samples of an epoch each rank reads: pure functions behind `ElasticSampler`.

The order of an epoch is fixed by (seed, epoch). What is left of it (the epoch minus the
samples already processed) is dealt out round-robin, padded by repeating the first remaining samples so
every rank has the same count (as torch's DistributedSampler does; this repeats at most
size-1 samples, only when what is left does not divide by the world size). Because every rank
can compute every other rank's share, each rank records the whole ring's batch at each step:
the processed set is global and identical on all ranks, and a commit on rank 0 alone knows
exactly which samples the committed model has seen.
"""

from __future__ import annotations

import random
from typing import Iterable, Sequence


def epoch_order(num_samples: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    order = list(range(num_samples))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def remaining(order: Sequence[int], processed: set[int]) -> list[int]:
    return [i for i in order if i not in processed]


def rank_share(left: Sequence[int], rank: int, size: int) -> list[int]:
    """Rank `rank`'s samples of `left`, padded so every rank gets the same number."""
    return [_padded(left, rank + j * size) for j in range(share_length(len(left), size))]


def share_length(num_left: int, size: int) -> int:
    return -(-num_left // size)


def batch_of_all_ranks(left: Sequence[int], size: int, batch_idx: int, batch_size: int) -> Iterable[int]:
    """The samples of batch `batch_idx` on every rank (what the ring processed at that step)."""
    return samples_of_all_ranks(left, size, batch_idx * batch_size, batch_size)


def samples_of_all_ranks(left: Sequence[int], size: int, first: int, count: int) -> Iterable[int]:
    """Samples `first` .. `first + count - 1` of every rank's share of `left` (a step's batch
    of the whole ring when `count` is the batch per rank)."""
    length = share_length(len(left), size)
    for j in range(first, min(first + count, length)):
        for r in range(size):
            yield _padded(left, r + j * size)


def _padded(left: Sequence[int], position: int) -> int:
    return left[position % len(left)]
