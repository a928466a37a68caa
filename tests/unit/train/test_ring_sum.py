"""Sums around the ring of point-to-point transfers (float16/bfloat16 in place, any float into a new
tensor): the schedule (pure), and real Gloo groups of three ranks (threads of this process,
loopback) against wider arithmetic."""

from __future__ import annotations

import threading
import weakref
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from ringmaster.torch import result_pool
from ringmaster.torch.result_pool import ResultPool
from ringmaster.worker.train import ring_sum
from ringmaster.worker.train.collectives import Communicator


def test_the_schedule_leaves_every_rank_with_every_segments_full_sum() -> None:
    for size in (2, 3, 5):
        # Each rank's segments as sets of the ranks whose contributions they hold.
        held = [[{r} for _ in range(size)] for r in range(size)]
        schedules = [ring_sum.segment_order(r, size) for r in range(size)]
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

    def rank_main(rank: int) -> Any:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("ring", store), rank, 3, timedelta(seconds=30))
        return work(Communicator(pg, rank, 3, generation=1, link=None, timeout_s=30))

    return _three_threads(rank_main)


def _three_threads(rank_main: Callable[[int], Any]) -> list[Any]:
    """`rank_main(rank)` for ranks 0-2, each on a thread; their results, once all returned."""
    results: list[Any] = [None] * 3
    errors: list[Exception] = []

    def run(rank: int) -> None:
        try:
            results[rank] = rank_main(rank)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    return results


#: The default chunk size, and a small odd one that splits every segment into many chunks whose
#: boundaries fall between elements' bytes.
CHUNKS = [ring_sum.CHUNK_BYTES, 12_345]


@pytest.mark.parametrize("chunk_bytes", CHUNKS)
def test_large_half_precision_sums_go_around_the_ring_and_match_float32(chunk_bytes: int, monkeypatch) -> None:
    monkeypatch.setattr(ring_sum, "CHUNK_BYTES", chunk_bytes)
    n = 300_001  # not a multiple of 3: segments of unequal length

    def work(comm: Communicator) -> tuple[torch.Tensor, torch.Tensor, bool]:
        generator = torch.Generator().manual_seed(comm.rank)
        a = torch.randn(n, generator=generator).half()
        b = torch.full((n,), float(comm.rank + 1), dtype=torch.bfloat16)
        assert ring_sum.takes(a, comm.size)
        first, second = comm.allreduce_async_(a), comm.allreduce_async_(b)  # in flight together
        second.wait()
        first.wait()
        return a, b, comm._ring_sum is not None

    results = _on_three_ranks(work)
    want = torch.stack(
        [torch.randn(n, generator=torch.Generator().manual_seed(r)).half().float() for r in range(3)]
    ).sum(0)
    for a, b, used_the_ring in results:
        assert used_the_ring
        assert torch.equal(b, torch.full((n,), 6.0, dtype=torch.bfloat16))
        assert torch.allclose(a.float(), want, atol=1e-2, rtol=1e-2)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][0], results[2][0])


@pytest.mark.parametrize("chunk_bytes", CHUNKS)
def test_sums_into_a_new_tensor_leave_the_input_alone_and_scale_once(chunk_bytes: int, monkeypatch) -> None:
    monkeypatch.setattr(ring_sum, "CHUNK_BYTES", chunk_bytes)
    n = 1_100_003  # 4.4 MB of float32, not a multiple of 3

    def inputs(rank: int) -> dict[str, torch.Tensor]:
        base = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        return {"float32": base, "float16": base.half(), "bfloat16": base.bfloat16(),
                "float64": base[:600_000].double()}

    def work(comm: Communicator) -> tuple[dict[str, torch.Tensor], dict[str, bool], bool]:
        sources = inputs(comm.rank)
        kept = {k: v.clone() for k, v in sources.items()}
        outs = {k: torch.full_like(v, float("nan")) for k, v in sources.items()}
        assert all(ring_sum.takes_into(v, comm.size) for v in sources.values())
        pending = [comm.sum_into_async_(sources[k], outs[k], 1 / 3) for k in sources]  # all in flight together
        for p in reversed(pending):
            p.wait()
        return outs, {k: torch.equal(sources[k], kept[k]) for k in sources}, comm._ring_sum is not None

    results = _on_three_ranks(work)
    want = {k: torch.stack([inputs(r)[k].double() for r in range(3)]).sum(0) / 3 for k in inputs(0)}
    tolerance = {"float32": 1e-6, "float64": 1e-12, "float16": 5e-3, "bfloat16": 3e-2}
    for outs, untouched, used_the_ring in results:
        assert used_the_ring and all(untouched.values()), untouched
        for k, out in outs.items():
            assert torch.allclose(out.double(), want[k], atol=tolerance[k], rtol=tolerance[k]), k
    for k in want:  # every rank ends with the same bytes
        assert torch.equal(results[0][0][k], results[1][0][k]) and torch.equal(results[0][0][k], results[2][0][k]), k


def test_a_dropped_result_of_a_ring_sum_is_free_for_the_result_pool() -> None:
    """Nothing the communicator keeps (its recent futures) holds the result: once the caller
    drops it, `hvd.allreduce`'s pool hands the same buffer out again (else: fresh memory, page
    faults, every call)."""

    def work(comm: Communicator) -> tuple[bool, bool]:
        pool = ResultPool()
        source = torch.ones(2_300_000)  # 9.2 MB: pooled
        first = pool.empty_like(source)
        comm.sum_into_async_(source, first, 0.5).wait()
        address, summed = first.data_ptr(), bool((first == 1.5).all())
        del first
        second = pool.empty_like(source)
        comm.sum_into_async_(source, second, 0.5).wait()
        return second.data_ptr() == address, summed and bool((second == 1.5).all())

    for reused, right in _on_three_ranks(work):
        assert reused and right


def test_a_ring_sum_holds_none_of_its_tensors_once_its_future_is_done() -> None:
    """At the moment rank 0's future is settled (its callback runs then, on the reduction's
    thread) only the caller's own reference to the output's storage is left: the thread let go of
    the reduction first. Were it held a moment longer, a caller that drops the result right after
    `wait()` would not free it, and the result pool would hand out fresh memory instead. Ranks 1
    and 2 start only after rank 0's callback is attached, so it runs on the settling thread."""
    store = dist.HashStore()
    users = result_pool._storage_users()
    assert users is not None
    attached = threading.Event()
    seen: list[int] = []

    def rank_main(rank: int) -> None:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("held", store), rank, 3, timedelta(seconds=30))
        ring = ring_sum.RingSum(pg, rank, 3, timeout_s=30)
        source, out = torch.ones(300_000), torch.empty(300_000)
        if rank != 0:
            attached.wait(30)
            ring.sum_into_async_(source, out).wait()
            return
        future = ring.sum_into_async_(source, out)
        future.add_done_callback(lambda _: seen.append(users(out)))
        attached.set()
        future.wait()
        assert torch.equal(out, torch.full((300_000,), 3.0))

    _three_threads(rank_main)
    assert seen == [1]


def test_small_sums_into_a_new_tensor_are_copied_then_summed_by_gloo() -> None:
    def work(comm: Communicator) -> tuple[bool, torch.Tensor, bool]:
        source = torch.full((1000,), float(comm.rank + 1))
        out = torch.empty_like(source)
        assert not ring_sum.takes_into(source, comm.size)
        comm.sum_into_async_(source, out, 0.5).wait()
        return torch.equal(source, torch.full((1000,), float(comm.rank + 1))), out, comm._ring_sum is not None

    for untouched, out, used_the_ring in _on_three_ranks(work):
        assert untouched and not used_the_ring and torch.equal(out, torch.full((1000,), 3.0))


@pytest.mark.parametrize("odd", ["length", "dtype"])
def test_ranks_reducing_different_tensors_are_refused_not_summed_wrongly(odd: str) -> None:
    """Rank 2 reduces a tensor of another length (or dtype) than ranks 0 and 1. Ranks whose left
    neighbour differs (0 and 2) refuse with a message naming both; rank 1, whose neighbour
    agrees, fails when its peers stop (here: its bounded wait). No rank returns a sum."""
    store = dist.HashStore()
    outcomes: list[Any] = [None] * 3

    def rank_main(rank: int) -> None:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("odd", store), rank, 3, timedelta(seconds=30))
        comm = Communicator(pg, rank, 3, generation=1, link=None, timeout_s=3)
        n = 600_000 + (1000 if odd == "length" and rank == 2 else 0)
        dtype = torch.bfloat16 if odd == "dtype" and rank == 2 else torch.float16
        try:
            comm.allreduce_(torch.ones(n, dtype=dtype))
            outcomes[rank] = "summed"
        except Exception as exc:  # the outcome under test
            outcomes[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), outcomes
    for rank in (0, 2):
        assert isinstance(outcomes[rank], ValueError), outcomes
        assert "every rank must reduce tensors of the same shape and dtype" in str(outcomes[rank])
    want = "601000 of torch.float16" if odd == "length" else "600000 of torch.bfloat16"
    assert want in str(outcomes[0]), outcomes[0]
    assert isinstance(outcomes[1], Exception), outcomes


def test_a_ring_sum_refuses_an_output_unlike_its_input() -> None:
    ring = ring_sum.RingSum(pg=None, rank=0, size=3, timeout_s=1)
    try:
        ring.sum_into_async_(torch.zeros(10), torch.zeros(11))
    except ValueError as exc:
        assert "shape (10,)" in str(exc)
    else:
        raise AssertionError("a mismatched output was accepted")


def test_finished_collectives_do_not_keep_their_tensors() -> None:
    """Over a hundred reductions in one generation: the communicator keeps the futures of those in
    flight only, so the tensors of finished ones are freed when their owner drops them."""

    def work(comm: Communicator) -> tuple[int, bool]:
        first = torch.ones(1000)
        gone = weakref.ref(first)
        comm.allreduce_(first)
        del first
        for _ in range(80):  # (160 collectives: four times the most that may stay in flight)
            comm.allreduce_(torch.ones(1000))
            comm.allreduce_(torch.ones(200_000, dtype=torch.float16))  # the half ring's futures too
        return len(comm._in_flight), gone() is None

    for kept, freed in _on_three_ranks(work):
        assert kept <= 40 and freed, (kept, freed)


def test_small_or_other_tensors_stay_with_gloo() -> None:
    assert not ring_sum.takes(torch.zeros(1000, dtype=torch.float16), 3)  # too small to pay
    assert not ring_sum.takes(torch.zeros(1 << 20), 3)  # float32: Gloo's sum is fast
    assert ring_sum.takes(torch.zeros(1 << 20, dtype=torch.bfloat16), 3)
    assert not ring_sum.takes(torch.zeros(1 << 20, dtype=torch.float16), 1)
    assert not ring_sum.takes(torch.zeros(1 << 20, 2, dtype=torch.float16).t(), 3)  # not contiguous
    assert ring_sum.takes_into(torch.zeros(1 << 20), 3)  # 4 MB of float32 into a new tensor: no copy first
    assert not ring_sum.takes_into(torch.zeros((1 << 20) - 1), 3)  # smaller: a copy and Gloo cost less
    assert not ring_sum.takes_into(torch.zeros(1 << 20, dtype=torch.int32), 3)  # integers: Gloo
    assert ring_sum.takes_into(torch.zeros(128 << 10, dtype=torch.float16), 3)  # as its in-place sums
    assert not ring_sum.takes_into(torch.zeros(1 << 20, 2).t(), 3)
