"""Float16 and bfloat16 sums around the ring of point-to-point transfers: the schedule (pure), and real Gloo
groups of three ranks (threads of this process, loopback) against float32 arithmetic."""

from __future__ import annotations

import threading
import weakref
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from ringmaster.worker.train import half_ring
from ringmaster.worker.train.collectives import Communicator


def test_the_schedule_leaves_every_rank_with_every_segments_full_sum() -> None:
    for size in (2, 3, 5):
        # Each rank's segments as sets of the ranks whose contributions they hold.
        held = [[{r} for _ in range(size)] for r in range(size)]
        schedules = [half_ring.segment_order(r, size) for r in range(size)]
        for step in range(size - 1):  # reduce-scatter: what the left neighbour sent is added
            sent = [set(held[r][schedules[r][0][step][0]]) for r in range(size)]
            for r in range(size):
                held[r][schedules[r][0][step][1]] |= sent[(r - 1) % size]
        assert all(held[r][(r + 1) % size] == set(range(size)) for r in range(size))
        for step in range(size - 1):  # allgather: what the left neighbour sent replaces
            sent = [set(held[r][schedules[r][1][step][0]]) for r in range(size)]
            for r in range(size):
                held[r][schedules[r][1][step][1]] = sent[(r - 1) % size]
        assert all(segment == set(range(size)) for r in range(size) for segment in held[r])


def _on_three_ranks(work: Callable[[Communicator], Any]) -> list[Any]:
    """`work(comm)` on each of three ranks of a real Gloo group (threads; an in-process store)."""
    store = dist.HashStore()
    results: list[Any] = [None] * 3
    errors: list[Exception] = []

    def rank_main(rank: int) -> None:
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore("half", store), rank, 3, timedelta(seconds=30))
            results[rank] = work(Communicator(pg, rank, 3, generation=1, link=None, timeout_s=30))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    return results


def test_large_half_precision_sums_go_around_the_ring_and_match_float32() -> None:
    n = 300_001  # not a multiple of 3: segments of unequal length

    def work(comm: Communicator) -> tuple[torch.Tensor, torch.Tensor, bool]:
        generator = torch.Generator().manual_seed(comm.rank)
        a = torch.randn(n, generator=generator).half()
        b = torch.full((n,), float(comm.rank + 1), dtype=torch.bfloat16)
        assert half_ring.takes(a, comm.size)
        first, second = comm.allreduce_async_(a), comm.allreduce_async_(b)  # in flight together
        second.wait()
        first.wait()
        return a, b, comm._half_ring is not None

    results = _on_three_ranks(work)
    want = torch.stack([torch.randn(n, generator=torch.Generator().manual_seed(r)).half().float() for r in range(3)]).sum(0)
    for a, b, used_the_ring in results:
        assert used_the_ring
        assert torch.equal(b, torch.full((n,), 6.0, dtype=torch.bfloat16))
        assert torch.allclose(a.float(), want, atol=1e-2, rtol=1e-2)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][0], results[2][0])


def test_finished_collectives_do_not_keep_their_tensors() -> None:
    """Hundreds of reductions in one generation: the communicator keeps the futures of those in
    flight only, so the tensors of finished ones are freed when their owner drops them."""

    def work(comm: Communicator) -> tuple[int, bool]:
        first = torch.ones(1000)
        gone = weakref.ref(first)
        comm.allreduce_(first)
        del first
        for _ in range(300):
            comm.allreduce_(torch.ones(1000))
            comm.allreduce_(torch.ones(200_000, dtype=torch.float16))  # the half ring's futures too
        return len(comm._in_flight), gone() is None

    for kept, freed in _on_three_ranks(work):
        assert kept <= 40 and freed, (kept, freed)


def test_small_or_other_tensors_stay_with_gloo() -> None:
    assert not half_ring.takes(torch.zeros(1000, dtype=torch.float16), 3)  # too small to pay
    assert not half_ring.takes(torch.zeros(1 << 20), 3)  # float32: Gloo's sum is fast
    assert half_ring.takes(torch.zeros(1 << 20, dtype=torch.bfloat16), 3)
    assert not half_ring.takes(torch.zeros(1 << 20, dtype=torch.float16), 1)
    assert not half_ring.takes(torch.zeros(1 << 20, 2, dtype=torch.float16).t(), 3)  # not contiguous
