"""Sums as a ring of point-to-point transfers, added by torch: half-precision sums in place, and
sums of any floating-point tensor into a new one.

Two things Gloo's own allreduce cannot do well are done here. Gloo sums float16 one element at a
time through a software conversion: on CPUs its float16 allreduce of N bytes takes as long as its
float32 allreduce of 2N, so fp16 compression saved nothing (bfloat16 fares better, but not
well). And Gloo reduces in place only: a sum into a new tensor (`hvd.allreduce`) had to copy the
input first, a pass over the whole tensor before any byte went out. This runs the same ring Gloo
runs (reduce-scatter, then allgather: each rank sends 2(n-1)/n of the tensor to its right
neighbour) with Gloo's send/recv for the transfers and torch's vectorized adds for the sums. A
sum into a new tensor sends its first segment straight from the input and receives straight
into the output, so no copy is made at all, and a scale (an average's 1/n) is applied to the one
segment each rank completes, 1/n of the tensor. The rounding is the same as Gloo's (each partial
sum in the tensor's dtype), and every rank ends with the same bytes (each segment is summed once,
then handed round).

Each reduction runs on a thread of its own; the tags of its transfers are taken when it is
started, in the order reductions are started (the same on every rank), so reductions in flight
together never take each other's messages. Every wait is bounded by the collective timeout; a
dead peer fails the transfer (and the reduction's future) at once.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Callable

import torch

#: The dtypes summed here in place (float32 and wider: Gloo's own ring is as fast).
HALF_DTYPES = (torch.float16, torch.bfloat16)
#: Smaller half-precision tensors go to Gloo's own allreduce (2(n-1) transfers cost more than the sum).
MIN_BYTES = 256 << 10
#: Sums of float32/float64 into a new tensor from this size on go around this ring; below it, a
#: copy and Gloo's in-place allreduce cost less than a thread and 2(n-1) transfers (measured,
#: 2 ranks: 0.4x of Gloo's in-place allreduce at 1 MB, 1.04-1.17x from 4 MB on).
MIN_BYTES_INTO = 4 << 20
#: Segments move in chunks of this size, each under a tag of its own, so that the adds of the
#: reduce-scatter overlap the transfer of the chunks after them (measured, 2 ranks: 2 MB chunks
#: 1.00-1.09x of Gloo's allreduce at 16/64 MB, whole segments 0.91-0.99x).
CHUNK_BYTES = 2 << 20
#: Gloo's point-to-point tags are 32-bit; ours lie in [_TAG_BASE, _TAG_BASE + _TAG_SPACE), apart
#: from the tags of the communicator's own send/recv (0: state sync).
_TAG_BASE = 1 << 20
#: The dtypes a reduction's length check tells apart (others are 0 on every rank).
_DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}
_TAG_SPACE = 1 << 29


def _ring_eligible(tensor: torch.Tensor, size: int) -> bool:
    return size > 1 and not tensor.is_cuda and tensor.is_contiguous()


def takes(tensor: torch.Tensor, size: int) -> bool:
    """Whether an in-place sum of `tensor` over `size` ranks goes around this ring instead of Gloo's."""
    return (_ring_eligible(tensor, size) and tensor.dtype in HALF_DTYPES
            and tensor.numel() * tensor.element_size() >= MIN_BYTES)


def takes_into(source: torch.Tensor, size: int) -> bool:
    """Whether a sum of `source` into a new tensor goes around this ring (else: copy, then an
    in-place sum). Half precision goes around it from the size its in-place sums do."""
    least = MIN_BYTES if source.dtype in HALF_DTYPES else MIN_BYTES_INTO
    return (_ring_eligible(source, size) and source.is_floating_point()
            and source.numel() * source.element_size() >= least)


def run_then_settle(pending: list[Callable[[], None]], future: torch.futures.Future) -> None:
    """Run the one callable in `pending` (a reduction, an exchange's waits), drop it (and with it
    every tensor it holds), then settle `future`: a caller that drops its result after `wait()`
    returns really frees it."""
    error: Exception | None = None
    try:
        pending.pop()()
    except Exception as exc:  # handed to whoever waits on the future
        error = exc
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def segment_order(rank: int, size: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(segment sent, segment received) at each step of the reduce-scatter and of the allgather
    for `rank` (pure). After the reduce-scatter, rank r holds the full sum of segment r+1."""
    scatter = [((rank - s) % size, (rank - s - 1) % size) for s in range(size - 1)]
    gather = [((rank + 1 - s) % size, (rank - s) % size) for s in range(size - 1)]
    return scatter, gather


class RingSum:
    """The ring sums of one ring (`pg`: a Gloo process group of `size` ranks)."""

    def __init__(self, pg: Any, rank: int, size: int, timeout_s: float) -> None:
        self.pg = pg
        self.rank = rank
        self.size = size
        self.timeout = timedelta(seconds=timeout_s)
        self._right, self._left = (rank + 1) % size, (rank - 1) % size  # the neighbours sent to, received from
        self._next_tag = 0  # relative to _TAG_BASE

    def sum_async_(self, tensor: torch.Tensor) -> torch.futures.Future:
        """Start summing `tensor` in place across the ring; its future is done (or failed) when
        the sum is in `tensor`."""
        flat = tensor.view(-1)
        return self._start(lambda tag, span: self._sum(flat, tag, span), flat)

    def sum_into_async_(self, source: torch.Tensor, out: torch.Tensor, scale: float = 1.0) -> torch.futures.Future:
        """Start summing `source` across the ring into `out` (same shape and dtype, contiguous;
        `source` is only read), then multiplying by `scale`; the future is done when it is in `out`."""
        if out.shape != source.shape or out.dtype != source.dtype or not out.is_contiguous():
            raise ValueError(f"the output of a ring sum must be a contiguous {source.dtype} tensor of shape "
                             f"{tuple(source.shape)}, got {out.dtype} {tuple(out.shape)}")
        flat_source, flat_out = source.reshape(-1), out.view(-1)
        return self._start(lambda tag, span: self._sum_into(flat_source, flat_out, scale, tag, span), flat_out)

    def _start(self, run: Callable[[int, int], None], flat: torch.Tensor) -> torch.futures.Future:
        """Take the tags of a reduction of `flat` and run it on a thread of its own: first the
        check that the left neighbour reduces a tensor of the same length and dtype (tag one),
        then `run(second tag, tags per transfer)`. The future's value is None: the communicator keeps recent
        futures, and one holding its tensor would keep a result the caller dropped (the result
        pool could not hand its buffer out again)."""
        span = _chunks(flat, self.size)  # tags per transfer: one per chunk
        first_tag = self.take_tags(1 + 2 * (self.size - 1) * span)
        future: torch.futures.Future = torch.futures.Future()

        def reduction() -> None:
            self._check_left_neighbour(flat, first_tag)
            run(first_tag + 1, span)

        # The thread gets the reduction in a list it empties, not as its target: a target (and
        # its args) stays referenced until the thread ends, after the future is settled, and
        # would hold `flat` for a moment after `wait()` returned.
        threading.Thread(target=run_then_settle, args=([reduction], future), name="ringmaster-ring-sum",
                         daemon=True).start()
        return future

    def _check_left_neighbour(self, flat: torch.Tensor, tag: int) -> None:
        """Refuse a reduction whose tensor differs in length or dtype from the left neighbour's
        (a user bug: ranks reducing different tensors). Without it, chunks of equal size would
        land in the wrong places and a rank could return a wrong sum as if nothing happened.
        Each rank checks its left neighbour, so around the ring all agree or one refuses; the
        check waits for 16 bytes from the neighbour before any data moves."""
        mine = torch.tensor([flat.numel(), _DTYPE_CODES.get(flat.dtype, 0)], dtype=torch.int64)
        theirs = torch.empty(2, dtype=torch.int64)
        sending = self.pg.send([mine], self._right, tag)
        self.pg.recv([theirs], self._left, tag).wait(self.timeout)
        sending.wait(self.timeout)
        if not torch.equal(mine, theirs):
            dtypes = {code: dtype for dtype, code in _DTYPE_CODES.items()}
            theirs_dtype = dtypes.get(int(theirs[1]), "another dtype")
            raise ValueError(
                f"allreduce: rank {self.rank} reduces {flat.numel()} elements of {flat.dtype}, but rank {self._left} "
                f"reduces {int(theirs[0])} of {theirs_dtype} at the same point: every rank must reduce tensors of "
                "the same shape and dtype, in the same order")

    def take_tags(self, count: int) -> int:
        """The first of `count` consecutive tags, taken in start order: the same on every rank,
        since reductions (and the ring's exchanges, `exchange`) are started in the same order
        with the same sizes."""
        if self._next_tag + count > _TAG_SPACE:
            self._next_tag = 0
        first = _TAG_BASE + self._next_tag
        self._next_tag += count
        return first

    def _sum(self, flat: torch.Tensor, tag: int, span: int) -> None:
        segments = list(flat.tensor_split(self.size))
        incoming = torch.empty(segments[0].numel(), dtype=flat.dtype)  # the first segment is the largest
        scatter, gather = segment_order(self.rank, self.size)
        for sent, received in scatter:
            into, target = incoming[: segments[received].numel()], segments[received]
            self._exchange(segments[sent], into, tag, lambda a, b: target[a:b].add_(into[a:b]))
            tag += span
        self._gather(segments, gather, tag, span)

    def _sum_into(self, source: torch.Tensor, out: torch.Tensor, scale: float, tag: int, span: int) -> None:
        inputs, outputs = list(source.tensor_split(self.size)), list(out.tensor_split(self.size))
        scatter, gather = segment_order(self.rank, self.size)
        for step, (sent, received) in enumerate(scatter):
            mine, landed = inputs[received], outputs[received]
            # After the last step this rank holds the full sum of `received`: each chunk is
            # scaled as it is summed, while it is still in cache.
            last = step == len(scatter) - 1 and scale != 1.0

            def combine(a: int, b: int, mine: torch.Tensor = mine, landed: torch.Tensor = landed,
                        last: bool = last) -> None:
                chunk = landed[a:b].add_(mine[a:b])
                if last:
                    chunk.mul_(scale)

            # The first segment sent is this rank's own input; each later one is the partial sum
            # received (into the output) the step before.
            self._exchange(inputs[sent] if step == 0 else outputs[sent], landed, tag, combine)
            tag += span
        self._gather(outputs, gather, tag, span)

    def _gather(self, segments: list[torch.Tensor], gather: list[tuple[int, int]], tag: int, span: int) -> None:
        for sent, received in gather:
            self._exchange(segments[sent], segments[received], tag)
            tag += span

    def _exchange(self, send: torch.Tensor, receive: torch.Tensor, tag: int,
                  combine: Callable[[int, int], Any] | None = None) -> None:
        """Send `send` to the right neighbour and receive `receive` from the left one, both at
        once, in chunks of CHUNK_BYTES under consecutive tags from `tag`; `combine(start, stop)`
        runs on each received chunk's range as soon as it has landed, so the adds of a
        reduce-scatter overlap the chunks still on the wire. (The neighbours' segments have the
        sizes of ours: each pair of transfers moves the same segment.)"""
        step = max(1, CHUNK_BYTES // send.element_size())
        sending = [self.pg.send([send[i:i + step]], self._right, tag + k)
                   for k, i in enumerate(range(0, send.numel(), step))]
        receiving = [(i, self.pg.recv([receive[i:i + step]], self._left, tag + k))
                     for k, i in enumerate(range(0, receive.numel(), step))]
        for start, work in receiving:
            work.wait(self.timeout)
            if combine is not None:
                combine(start, min(start + step, receive.numel()))
        for work in sending:
            work.wait(self.timeout)


def _chunks(flat: torch.Tensor, size: int) -> int:
    """How many chunks the largest segment of `flat` over `size` ranks is moved in."""
    largest = -(-flat.numel() // size)
    return max(1, -(-largest * flat.element_size() // CHUNK_BYTES))
