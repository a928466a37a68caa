"""Allreduce of half-precision CPU tensors as a ring of point-to-point transfers, summed by torch.

Gloo sums float16 one element at a time through a software conversion: on CPUs its float16
allreduce of N bytes takes as long as its float32 allreduce of 2N, so fp16 compression saved
nothing (bfloat16 fares better, but not well). This runs the same ring Gloo runs
(reduce-scatter, then allgather: each rank sends 2(n-1)/n of the tensor to its right
neighbour) with Gloo's send/recv for the transfers and torch's vectorized adds for the sums;
the rounding is the same (each partial sum in the tensor's dtype).

Each reduction runs on a thread of its own; the tags of its transfers are taken when it is
started, in the order reductions are started (the same on every rank), so reductions in flight
together never take each other's messages. Every wait is bounded by the collective timeout; a
dead peer fails the transfer (and the reduction's future) at once.
"""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from typing import Any

import torch

#: The dtypes summed here (float32 and wider: Gloo's own ring is faster).
DTYPES = (torch.float16, torch.bfloat16)
#: Smaller tensors go to Gloo's own allreduce (a ring of 2(n-1) transfers costs more than the sum).
MIN_BYTES = 256 << 10
#: Gloo's point-to-point tags are 32-bit; ours lie in [_TAG_BASE, _TAG_BASE + _TAG_SPACE), apart
#: from the tags of the communicator's own send/recv (0: state sync).
_TAG_BASE = 1 << 20
_TAG_SPACE = 1 << 29


def takes(tensor: torch.Tensor, size: int) -> bool:
    """Whether a sum of `tensor` over `size` ranks goes around this ring instead of Gloo's."""
    return (size > 1 and tensor.dtype in DTYPES and not tensor.is_cuda and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() >= MIN_BYTES)


def segment_order(rank: int, size: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(segment sent, segment received) at each step of the reduce-scatter and of the allgather
    for `rank` (pure). After the reduce-scatter, rank r holds the full sum of segment r+1."""
    scatter = [((rank - s) % size, (rank - s - 1) % size) for s in range(size - 1)]
    gather = [((rank + 1 - s) % size, (rank - s) % size) for s in range(size - 1)]
    return scatter, gather


class HalfRing:
    """The half-precision sums of one ring (`pg`: a Gloo process group of `size` ranks)."""

    def __init__(self, pg: Any, rank: int, size: int, timeout_s: float) -> None:
        self.pg = pg
        self.rank = rank
        self.size = size
        self.timeout = timedelta(seconds=timeout_s)
        self._tags = itertools.count()

    def sum_async_(self, tensor: torch.Tensor) -> torch.futures.Future:
        """Start summing `tensor` in place across the ring; its future is done (or failed) when
        the sum is in `tensor`."""
        first_tag = _TAG_BASE + next(self._tags) * 2 * (self.size - 1) % _TAG_SPACE
        future: torch.futures.Future = torch.futures.Future()

        def run() -> None:
            try:
                self._sum(tensor.view(-1), first_tag)
                future.set_result(tensor)
            except Exception as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

        threading.Thread(target=run, name="ringmaster-half-ring", daemon=True).start()
        return future

    def _sum(self, flat: torch.Tensor, tag: int) -> None:
        segments = list(flat.tensor_split(self.size))
        incoming = torch.empty(segments[0].numel(), dtype=flat.dtype)  # the first segment is the largest
        scatter, gather = segment_order(self.rank, self.size)
        for sent, received in scatter:
            into = incoming[: segments[received].numel()]
            self._exchange(segments[sent], into, tag)
            segments[received].add_(into)
            tag += 1
        for sent, received in gather:
            self._exchange(segments[sent], segments[received], tag)
            tag += 1

    def _exchange(self, send: torch.Tensor, receive: torch.Tensor, tag: int) -> None:
        """Send to the right neighbour and receive from the left one, both at once."""
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        sending = self.pg.send([send], right, tag)
        receiving = self.pg.recv([receive], left, tag)
        receiving.wait(self.timeout)
        sending.wait(self.timeout)
