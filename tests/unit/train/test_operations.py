"""Horovod's collectives as queued operations, on real Gloo rings of 2 and 3 ranks (threads of
this process, an in-process store): each op and dtype against a single-process reference,
errors raised on every rank with the ring usable after, fusion, process sets' rings, and the
pure negotiation."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from gloo_rings import count_collectives, on_ranks, run

from ringmaster.torch import operations as ops
from ringmaster.worker.train import exchange, negotiation
from ringmaster.worker.train.collectives import Communicator
from ringmaster.worker.train.errors import CollectiveMismatchError
from ringmaster.worker.train.negotiation import Descriptor, Kind
from ringmaster.worker.train.op_queue import EARLY_DATA_ENV, INLINE_BYTES_ENV, Operation

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
          torch.int16,
          torch.uint8]


@pytest.fixture(params=["inline", "early", "collective"])
def either_path(request, monkeypatch) -> str:
    """Each semantics test three times: small operations carried in the negotiation round and
    done from every rank's bytes (the default); nothing carried, an allgather's, alltoall's or
    reducescatter's data sent during its round (the default for larger ones); and every
    operation as a collective of its own after its round."""
    if request.param != "inline":
        monkeypatch.setenv(INLINE_BYTES_ENV, "0")
    if request.param == "collective":
        monkeypatch.setenv(EARLY_DATA_ENV, "0")
    return request.param


def _input(rank: int, dtype: torch.dtype, shape=(5, 3)) -> torch.Tensor:
    values = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape) % 7 + rank * 3 + 1
    return values.to(dtype)


@pytest.mark.usefixtures("either_path")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", [ops.Sum, ops.Average, ops.Min, ops.Max, ops.Product])
def test_allreduce_matches_the_single_process_reduction_for_every_op_and_dtype(op: str, dtype: torch.dtype) -> None:
    n = 3
    stacked = torch.stack([_input(r, torch.float64) for r in range(n)])
    reference = {ops.Sum: stacked.sum(0), ops.Average: stacked.sum(0) / n, ops.Min: stacked.min(0).values,
                 ops.Max: stacked.max(0).values, ops.Product: stacked.prod(0)}[op]
    if not dtype.is_floating_point:
        reference = reference.trunc()  # Horovod: an integer average is truncated
        if dtype in (torch.int8, torch.uint8) and op in (ops.Sum, ops.Product):
            reference = reference.to(torch.int64).to(dtype).to(torch.float64)  # wraps as the dtype does

    def work(comm: Communicator) -> torch.Tensor:
        tensor = _input(comm.rank, dtype)
        out = torch.empty_like(tensor)
        return run(comm, ops.allreduce(tensor, out, op, 1.0, 1.0, None))

    for result in on_ranks(n, work):
        assert result.dtype == dtype
        tolerance = {torch.float16: 0.05,
                     torch.bfloat16: 0.5}.get(dtype, 1e-6) * max(1.0, float(reference.abs().max()) / 100)
        assert torch.allclose(result.to(torch.float64), reference, atol=tolerance), (result, reference)


@pytest.mark.usefixtures("either_path")
def test_integer_tensors_are_scaled_as_horovod_does_truncating_toward_zero() -> None:
    def work(comm: Communicator) -> list[int]:
        tensor = torch.tensor([3, -3, 7], dtype=torch.int32)
        return run(comm, ops.allreduce(tensor, tensor, ops.Sum, 0.5, 1.0, None)).tolist()

    # each rank: trunc(0.5 * x) = [1, -1, 3]; summed over 2 ranks
    assert on_ranks(2, work) == [[2, -2, 6]] * 2

    def average(comm: Communicator) -> list[int]:
        tensor = torch.tensor([1 + comm.rank, -4], dtype=torch.int64)
        return run(comm, ops.allreduce(tensor, tensor, ops.Average, 1.0, 3.0, None)).tolist()

    # sums [3, -8], then x 3/2 truncated: [4, -12]
    assert on_ranks(2, average) == [[4, -12]] * 2


@pytest.mark.usefixtures("either_path")
def test_prescale_and_postscale_apply_before_and_after_the_sum() -> None:
    def work(comm: Communicator) -> torch.Tensor:
        tensor = torch.full((4,), 1.0 + comm.rank)
        return run(comm, ops.allreduce(tensor, torch.empty(4), ops.Average, 2.0, 10.0, None))

    for result in on_ranks(3, work):
        assert torch.allclose(result, torch.full((4,), (2 + 4 + 6) / 3 * 10))


@pytest.mark.usefixtures("either_path")
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16, torch.uint8], ids=str)
def test_allgather_joins_first_dimensions_that_differ_by_rank(n: int, dtype: torch.dtype) -> None:
    def mine(rank: int) -> torch.Tensor:
        return (torch.arange((rank + 1) * 2).reshape(rank + 1, 2) + 10 * rank).to(dtype)

    results = on_ranks(n, lambda comm: run(comm, ops.allgather(mine(comm.rank), None)))
    expected = torch.cat([mine(r) for r in range(n)])
    assert all(torch.equal(r, expected) for r in results)

    same = on_ranks(n, lambda comm: run(comm, ops.allgather(torch.full((2,), comm.rank).to(dtype), None)))
    assert all(torch.equal(r, torch.tensor([r_ for r_ in range(n) for _ in range(2)]).to(dtype)) for r in same)


def test_grouped_allgather_gathers_each_tensor_with_its_own_first_dimensions() -> None:
    def work(comm: Communicator) -> list[torch.Tensor]:
        return run(comm, ops.grouped_allgather([torch.full((comm.rank + 1,), comm.rank), torch.ones(1, 3) * comm.rank],
                                               None))

    for first, second in on_ranks(3, work):
        assert first.tolist() == [0, 1, 1, 2, 2, 2]
        assert second.tolist() == [[0.0] * 3, [1.0] * 3, [2.0] * 3]


@pytest.mark.usefixtures("either_path")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.bool, torch.bfloat16], ids=str)
def test_broadcast_gives_every_rank_the_roots_tensor(dtype: torch.dtype) -> None:
    def work(comm: Communicator) -> torch.Tensor:
        tensor = torch.full((3, 2), comm.rank).to(dtype)
        return run(comm, ops.broadcast(tensor, torch.empty_like(tensor), 2, None))

    assert all(torch.equal(r, torch.full((3, 2), 2).to(dtype)) for r in on_ranks(3, work))


@pytest.mark.usefixtures("either_path")
def test_alltoall_sends_each_rank_its_rows_and_says_how_many_came_from_whom() -> None:
    n = 3
    # rank r sends (2j + r) % 3 rows to rank j, each row naming (sender, receiver): mostly not as
    # many as it receives from j (early data guesses as many, and is corrected)
    splits = {r: [(2 * j + r) % 3 for j in range(n)] for r in range(n)}

    def work(comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [[comm.rank, j] for j in range(n) for _ in range(splits[comm.rank][j])]
        tensor = torch.tensor(rows + [[9, 9]], dtype=torch.int64)  # a trailing row the splits leave out
        return run(comm, ops.alltoall(tensor, splits[comm.rank], n, None))

    for me, (out, received) in enumerate(on_ranks(n, work)):
        assert received.dtype == torch.int32
        assert received.tolist() == [splits[r][me] for r in range(n)]
        assert out.tolist() == [[r, me] for r in range(n) for _ in range(splits[r][me])]


@pytest.mark.usefixtures("either_path")
def test_alltoall_without_splits_divides_equally_and_refuses_rows_that_do_not_divide() -> None:
    def work(comm: Communicator) -> list[int]:
        out, received = run(comm, ops.alltoall(torch.arange(4) + 10 * comm.rank, None, 2, None))
        return out.tolist() + received.tolist()

    assert on_ranks(2, work) == [[0, 1, 10, 11, 2, 2], [2, 3, 12, 13, 2, 2]]
    with pytest.raises(ValueError, match="do not divide"):
        ops.alltoall(torch.arange(5), None, 2, None)
    with pytest.raises(ValueError, match="more than"):
        ops.alltoall(torch.arange(5), [3, 3], 2, None)
    with pytest.raises(ValueError, match="give 2"):
        ops.alltoall(torch.arange(5), [1, 1, 1], 2, None)


def test_allgather_and_alltoall_past_the_early_data_limit_move_each_peers_rows_straight_into_place(monkeypatch) -> None:
    """Over `speculation.MAX_BYTES` per peer an operation's data goes after its round, one
    transfer to and from each peer (`exchange`): first dimensions that differ by rank, splits
    that differ by peer, rows of 1 MB, on 3 ranks."""
    n, row = 3, 1 << 18  # float32 rows of 1 MB
    splits = {r: [(2 * j + r) % 3 + 4 for j in range(n)] for r in range(n)}  # 4 to 6 MB to each peer

    def rows_of(rank: int, count: int, salt: int) -> torch.Tensor:
        return torch.arange(count, dtype=torch.float32).unsqueeze(1) + torch.zeros(count, row) + 100 * rank + salt

    def work(comm: Communicator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gathered = run(comm, ops.allgather(rows_of(comm.rank, comm.rank + 5, 0), None))
        mine = torch.cat([rows_of(comm.rank, splits[comm.rank][j], 10 * j) for j in range(n)])
        out, received = run(comm, ops.alltoall(mine, splits[comm.rank], n, None))
        return gathered, out, received

    exchanges: list[int] = []
    original = exchange.start
    def counted(*args: Any) -> Any:
        exchanges.append(1)
        return original(*args)

    monkeypatch.setattr(exchange, "start", counted)
    expected_gather = torch.cat([rows_of(r, r + 5, 0) for r in range(n)])
    results = on_ranks(n, work)
    assert len(exchanges) == 2 * n  # (one allgather, one alltoall on each rank)
    for me, (gathered, out, received) in enumerate(results):
        assert torch.equal(gathered, expected_gather)
        assert received.tolist() == [splits[r][me] for r in range(n)]
        assert torch.equal(out, torch.cat([rows_of(r, splits[r][me], 10 * me) for r in range(n)]))


@pytest.mark.usefixtures("either_path")
@pytest.mark.parametrize("rows", [6, 7, 2])
@pytest.mark.parametrize("op", [ops.Sum, ops.Average, ops.Max])
def test_reducescatter_gives_each_rank_its_rows_of_the_reduction_as_horovod_splits_them(rows: int, op: str) -> None:
    n = 3
    stacked = torch.stack([_input(r, torch.float64, (rows, 2)) for r in range(n)])
    full = {ops.Sum: stacked.sum(0), ops.Average: stacked.mean(0), ops.Max: stacked.max(0).values}[op]
    counts = [ops.scatter_rows(rows, n, r) for r in range(n)]
    assert sum(counts) == rows and counts == sorted(counts, reverse=True)

    results = on_ranks(n, lambda comm: run(comm, ops.reducescatter(_input(comm.rank, torch.float64, (rows, 2)), op,
                                                                     1.0, 1.0, None)))
    assert torch.allclose(torch.cat(results), full)
    assert [r.shape[0] for r in results] == counts


def test_grouped_reducescatter_scatters_each_tensor() -> None:
    def work(comm: Communicator) -> list[torch.Tensor]:
        return run(comm, ops.grouped_reducescatter([torch.ones(4), torch.arange(2.0)], ops.Sum, 1.0, 1.0, None))

    (a0, b0), (a1, b1) = on_ranks(2, work)
    assert a0.tolist() == [2, 2] and a1.tolist() == [2, 2] and b0.tolist() == [0] and b1.tolist() == [2]


@pytest.mark.usefixtures("either_path")
def test_ranks_that_disagree_get_an_error_naming_it_on_every_rank_and_the_ring_goes_on() -> None:
    def work(comm: Communicator) -> tuple[str, str, str, list[float]]:
        errors = []
        for operation in (
            ops.allreduce(torch.ones(3 + comm.rank), torch.empty(3 + comm.rank), ops.Sum, 1.0, 1.0, None),  # shape
            ops.allreduce(torch.ones(3, dtype=torch.float32 if comm.rank else torch.float64),
                          torch.empty(3, dtype=torch.float32 if comm.rank else torch.float64), ops.Sum, 1.0, 1.0, None),
            ops.broadcast(torch.ones(2), torch.empty(2), comm.rank, None),  # root
        ):
            with pytest.raises(CollectiveMismatchError) as caught:
                run(comm, operation)
            errors.append(str(caught.value))
        after = run(comm, ops.allreduce(torch.ones(2), torch.empty(2), ops.Sum, 1.0, 1.0, None))
        return (*errors, after.tolist())  # type: ignore[return-value]

    for shape, dtype, root, after in on_ranks(3, work):
        assert "ndim" in shape or "dim0" in shape or "shape" in shape
        assert "dtype" in dtype
        assert "root_rank" in root
        assert after == [3.0, 3.0]


@pytest.mark.usefixtures("either_path")
def test_another_op_at_the_same_point_is_refused_on_every_rank() -> None:
    def work(comm: Communicator) -> str:
        operation = ops.allgather(torch.ones(2), None) if comm.rank == 1 else \
            ops.allreduce(torch.ones(2), torch.empty(2), ops.Sum, 1.0, 1.0, None)
        with pytest.raises(CollectiveMismatchError) as caught:
            run(comm, operation)
        return str(caught.value)

    messages = on_ranks(2, work)
    assert "allgather" in messages[0] and "allreduce" in messages[1]


def count_allreduce_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wraps the ring's own allreduce so a test can see how many collectives a batch of queued
    operations became and how large each was (the real allreduce still runs). Nothing is carried
    in the negotiation round (`RINGMASTER_INLINE_BYTES=0`): every operation is a collective."""
    monkeypatch.setenv(INLINE_BYTES_ENV, "0")
    calls: list[int] = []
    original = Communicator.allreduce_async_

    def counting(self: Communicator, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> Any:
        calls.append(tensor.numel())
        return original(self, tensor, op)

    monkeypatch.setattr(Communicator, "allreduce_async_", counting)
    return calls


def submit_together(comm: Communicator, queued: list[Operation]) -> None:
    """Queues operations while the ring's thread is held by a first one, so that they wait in
    the queue together and the queue sees them as one batch."""
    gate, taken = threading.Event(), threading.Event()

    def block(c: Communicator) -> Any:
        taken.set()
        return gate.wait(5) and c.allreduce_(torch.zeros(1))

    comm.ops.submit(Operation(Descriptor(Kind.BARRIER, ()), block))
    # The thread must have taken the blocker as a round of its own before the rest is queued: a
    # thread slow to wake took the blocker with the first few, split the batch, and one rank's
    # round ended between two of the small tensors (1 run in 3 of `pytest -q`).
    assert taken.wait(10), "the queue's thread never took the first operation"
    for operation in queued:
        comm.ops.submit(operation)
    gate.set()


def test_allreduces_queued_together_are_fused_into_fewer_collectives(monkeypatch) -> None:
    calls = count_allreduce_sizes(monkeypatch)

    def work(comm: Communicator) -> list[list[float]]:
        tensors = [torch.full((k + 1,), float(comm.rank + k), dtype=torch.float64) for k in range(20)]
        outputs = [torch.empty_like(t) for t in tensors]
        queued = [ops.allreduce(t, o, ops.Sum, 1.0, 1.0, f"t{k}") for k, (t, o) in enumerate(zip(tensors, outputs))]
        submit_together(comm, queued)
        return [o.outcome().tolist() for o in queued]

    results = on_ranks(2, work)
    for k in range(20):
        assert results[0][k] == results[1][k] == [float(1 + 2 * k)] * (k + 1)
    reductions = [c for c in calls if c > 1]
    assert len(reductions) <= 2 * 2, f"20 allreduces queued together on 2 ranks took {len(reductions)} reductions"


@pytest.mark.usefixtures("either_path")
def test_a_process_set_runs_on_a_ring_of_its_own_members() -> None:
    def work(comm: Communicator) -> Any:
        evens = (0, 2)
        if comm.rank in evens:
            sub = comm.subgroup(evens)
            summed = run(sub, ops.allreduce(torch.tensor([comm.rank + 1.0]), torch.empty(1), ops.Sum, 1.0, 1.0, None))
            gathered = run(sub, ops.allgather(torch.tensor([comm.rank]), None))
            return sub.size, sub.rank, summed.tolist(), gathered.tolist()
        with pytest.raises(ValueError, match="not in the process set"):
            comm.subgroup(evens)
        return run(comm.subgroup((1,)),
                   ops.allreduce(torch.tensor([5.0]), torch.empty(1), ops.Sum, 1.0, 1.0, None)).tolist()

    results = on_ranks(3, work)
    assert results[0] == (2, 0, [4.0], [0, 2]) and results[2] == (2, 1, [4.0], [0, 2])
    assert results[1] == [5.0]


@pytest.mark.usefixtures("either_path")
def test_named_operations_queued_in_different_orders_meet_by_name_as_horovods_do() -> None:
    orders = [["a", "b", "c"], ["c", "a", "b"], ["b", "c", "a"]]

    def work(comm: Communicator) -> tuple[dict[str, list[float]], bool]:
        handles = {n: comm.ops.submit(ops.allreduce(torch.full((3,), float(ord(n) + comm.rank)), torch.empty(3),
                                                    ops.Sum, 1.0, 1.0, n)) for n in orders[comm.rank]}
        sums = {n: h.outcome().tolist() for n, h in handles.items()}
        # Horovod's duplicate-name tests: rank 0 issues 'dup' before a barrier, the others after it
        if comm.rank == 0:
            dup = comm.ops.submit(ops.allreduce(torch.ones(2), torch.empty(2), ops.Sum, 1.0, 1.0, "dup"))
            run(comm, ops.barrier())
        else:
            run(comm, ops.barrier())
            dup = comm.ops.submit(ops.allreduce(torch.ones(2), torch.empty(2), ops.Sum, 1.0, 1.0, "dup"))
        return sums, dup.outcome().tolist() == [3.0, 3.0]

    for sums, dup_met in on_ranks(3, work):
        assert sums == {n: [3.0 * ord(n) + 3] * 3 for n in "abc"} and dup_met


def test_a_joined_rank_takes_part_in_the_others_allreduces_with_the_identity_and_join_gives_the_last_rank() -> None:
    def work(comm: Communicator) -> tuple[int, list, list, str, list]:
        averaged: list = []
        smallest: list = []
        refused = ""
        if comm.rank > 0:
            averaged = run(comm, ops.allreduce(torch.full((4,), 3 * comm.rank, dtype=torch.int32),
                                               torch.empty(4, dtype=torch.int32), ops.Average, 1.0, 1.0, "x")).tolist()
            smallest = run(comm, ops.allreduce(torch.tensor([comm.rank + 1.0]), torch.empty(1), ops.Min, 1.0, 1.0,
                                               None)).tolist()
            run(comm, ops.barrier())
            with pytest.raises(CollectiveMismatchError) as caught:
                run(comm, ops.allgather(torch.ones(2), None))
            refused = str(caught.value)
        last = run(comm, ops.join())
        after = run(comm, ops.allreduce(torch.ones(1), torch.empty(1), ops.Sum, 1.0, 1.0, None)).tolist()
        return last, averaged, smallest, refused, after

    results = on_ranks(3, work)
    assert len({last for last, *_ in results}) == 1 and results[0][0] in (1, 2)  # (1 and 2 may join in one round)
    for rank, (_, averaged, smallest, refused, after) in enumerate(results):
        assert after == [3.0]
        if rank:  # (3 + 6) / 3 workers, the joined one's zeros counted, as Horovod averages; min of 2 and 3
            assert averaged == [3] * 4 and smallest == [2.0]
            assert "allgather: rank 0 joined (hvd.join())" in refused


def test_an_operation_one_rank_never_issues_is_given_up_everywhere_after_the_timeout_and_the_ring_goes_on() -> None:
    def work(comm: Communicator) -> tuple[str, list[float], float]:
        started = time.monotonic()
        lone = ops.barrier() if comm.rank == 0 else ops.allreduce(torch.ones(2), torch.empty(2), ops.Sum, 1.0, 1.0,
                                                                  "only-on-rank-1")
        with pytest.raises(CollectiveMismatchError) as caught:
            run(comm, lone)
        waited = time.monotonic() - started
        run(comm, ops.barrier())  # the unnamed go on from one place again
        return str(caught.value), run(comm, ops.allreduce(torch.ones(2), torch.empty(2), ops.Sum, 1.0, 1.0,
                                                          None)).tolist(), waited

    (zero, after0, waited0), (one, after1, waited1) = on_ranks(2, work, timeout_s=1.0)
    assert after0 == after1 == [2.0, 2.0] and 1.0 <= waited0 < 10 and 1.0 <= waited1 < 10
    assert zero.startswith("barrier (unnamed no. 1) was given up: rank 1 did not issue it") and "timeout" in zero
    assert one.startswith("allreduce 'only-on-rank-1' was given up: rank 0 did not issue it")
    assert (
        "rank 0 waited with barrier (unnamed no. 1)" in one and "rank 1 waited with allreduce 'only-on-rank-1'" in one
    )


@pytest.mark.usefixtures("either_path")
def test_dtypes_gloo_lacks_travel_as_bytes_or_reduce_in_a_wider_dtype_wrapping_as_their_own() -> None:
    def work(comm: Communicator) -> dict[str, list]:
        got = {}
        for dtype in (torch.int16, torch.uint16, torch.uint32):
            mine = torch.tensor([30000, 7, comm.rank], dtype=torch.int64).to(dtype)
            got[f"sum {dtype}"] = run(comm, ops.allreduce(mine, torch.empty_like(mine), ops.Sum, 1.0, 1.0,
                                                          None)).to(torch.int64).tolist()
            got[f"max {dtype}"] = run(comm, ops.allreduce(mine, torch.empty_like(mine), ops.Max, 1.0, 1.0,
                                                          None)).to(torch.int64).tolist()
            got[f"bcast {dtype}"] = run(comm, ops.broadcast(mine, torch.empty_like(mine), 1, None)).to(
                torch.int64).tolist()
        z = torch.tensor([1 + 2j, comm.rank * 1j], dtype=torch.complex64)
        got["complex"] = run(comm, ops.allreduce(z, torch.empty_like(z), ops.Sum, 1.0, 1.0, None)).tolist()
        with pytest.raises(ValueError, match="can only be summed or averaged"):
            run(comm, ops.allreduce(z, torch.empty_like(z), ops.Max, 1.0, 1.0, None))
        got["after"] = run(comm, ops.allreduce(torch.ones(2), torch.empty(2), ops.Sum, 1.0, 1.0, None)).tolist()
        return got

    for got in on_ranks(2, work):
        assert got["sum torch.int16"] == [-5536, 14, 1]  # 60000 wraps in 16 bits, as int16 arithmetic does
        assert got["sum torch.uint16"] == [60000, 14, 1] and got["sum torch.uint32"] == [60000, 14, 1]
        assert all(got[f"max {d}"] == [30000, 7, 1] and got[f"bcast {d}"] == [30000, 7, 1]
                   for d in (torch.int16, torch.uint16, torch.uint32))
        assert got["complex"] == [2 + 4j, 1j] and got["after"] == [2.0, 2.0]


def test_an_average_is_a_true_division_so_equal_tensors_average_to_themselves_exactly() -> None:
    # Whole numbers, whose sum over 3 ranks is exact; past the inline area, so a collective. Before,
    # the average was scaled before the sum (v/3 + v/3 + v/3), which is not v.
    values = torch.arange(-2049.0, 2050.0, dtype=torch.float32) + 0.5

    def work(comm: Communicator) -> bool:
        out = run(comm, ops.allreduce(values, torch.empty_like(values), ops.Average, 1.0, 1.0, None))
        return torch.equal(out, values)

    assert on_ranks(3, work) == [True, True, True]


def test_queued_operations_fail_when_the_ring_is_retired() -> None:
    store = dist.HashStore()
    pg = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=5))
    comm = Communicator(pg, 0, 1, generation=4, link=None, timeout_s=5)
    gate, running = threading.Event(), threading.Event()

    def hold(comm: Communicator) -> bool:
        running.set()
        return gate.wait(5)

    comm.ops.submit(Operation(Descriptor(Kind.BARRIER, ()), hold))
    assert running.wait(5)  # (queued before the first round began, the barrier would be in it)
    waiting = comm.ops.submit(ops.barrier())
    comm.close("a peer died")
    gate.set()
    with pytest.raises(Exception, match="generation 4 ended before the operation ran: a peer died"):
        waiting.outcome()
    late = comm.ops.submit(ops.barrier())
    with pytest.raises(Exception, match="generation 4"):
        late.outcome()


def test_the_negotiation_matches_by_name_in_the_first_ranks_order_and_names_a_disagreement() -> None:
    a = Descriptor(Kind.ALLREDUCE, (torch.ones(3),), op=1, name="grad")
    c = Descriptor(Kind.ALLREDUCE, (torch.ones(2),), op=1, name="other")
    messages = [negotiation.encode([a, c]), negotiation.encode([c, a])]  # rank 1 queued them the other way
    on_zero, on_one = negotiation.decide(messages, [a, c], 0), negotiation.decide(messages, [c, a], 1)
    assert [x.mine for x in on_zero.agreed] == [0, 1] and [x.mine for x in on_one.agreed] == [1, 0]
    assert not any(x.refused for x in on_zero.agreed + on_one.agreed) and not on_zero.first_shared
    # only what every rank queued runs; the rest waits for the next round
    assert [x.mine for x in negotiation.decide([negotiation.encode([a, c]), negotiation.encode([c])], [a, c],
                                               0).agreed] == [1]
    b = Descriptor(Kind.ALLREDUCE, (torch.ones(4),), op=1, name="grad")
    verdict = negotiation.decide([negotiation.encode([a]), negotiation.encode([b])], [a], 0)
    assert "rank 1" in verdict.agreed[0].refused and "'grad'" in verdict.agreed[0].refused
    # unnamed operations meet by their place among the ring's unnamed ones; a named one meets no unnamed one
    u0, u1 = (Descriptor(Kind.ALLREDUCE, (torch.ones(3),), op=1, seq=k) for k in (0, 1))
    assert [x.mine for x in negotiation.decide([negotiation.encode([u0, u1]), negotiation.encode([u0])], [u0, u1],
                                               0).agreed] == [0]
    assert negotiation.decide([negotiation.encode([a]), negotiation.encode([u0])], [a], 0).agreed == []
    g1 = Descriptor(Kind.ALLGATHER, (torch.ones(2, 5),))
    g2 = Descriptor(Kind.ALLGATHER, (torch.ones(7, 5),))
    verdict = negotiation.decide([negotiation.encode([g1]), negotiation.encode([g2])], [g1], 0)
    assert verdict.agreed[0].refused == "" and verdict.agreed[0].first_dims == [2, 7] and verdict.first_shared


def test_a_rank_that_waited_too_long_makes_every_rank_give_up_naming_what_each_waited_with() -> None:
    a = Descriptor(Kind.ALLREDUCE, (torch.ones(3),), op=1, name="grad")
    c = Descriptor(Kind.BROADCAST, (torch.ones(2),), root=0, name="other")
    u = Descriptor(Kind.BARRIER, (), seq=4)
    messages = [negotiation.encode([a, u], head=negotiation.Head(stalled=True, next_seq=5)),
                negotiation.encode([u, c], head=negotiation.Head(next_seq=9))]
    verdict = negotiation.decide(messages, [a, u], 0)
    assert [x.mine for x in verdict.agreed] == [1] and verdict.stalled and verdict.next_seq == 9
    why = verdict.abandoned[0]
    assert "allreduce 'grad' was given up: rank 1 did not issue it" in why
    assert "rank 0 waited with allreduce 'grad'" in why and "rank 1 waited with broadcast under another name" in why
    assert list(negotiation.decide(messages, [u, c], 1).abandoned) == [1]
    calm = [negotiation.encode([a]), negotiation.encode([c])]
    assert negotiation.decide(calm, [a], 0) == negotiation.Verdict([], {}, [], None, False, False, 0)


def test_a_joined_rank_stands_in_for_allreduces_and_every_rank_learns_who_joined_last() -> None:
    a = Descriptor(Kind.ALLREDUCE, (torch.ones(3, dtype=torch.float64),), op=negotiation.Reduction.AVERAGE, name="a")
    g = Descriptor(Kind.ALLGATHER, (torch.ones(2),), seq=0)
    messages = [negotiation.encode([], head=negotiation.Head(joined=True, joined_at=3)), negotiation.encode([a, g])]
    joined, working = negotiation.decide(messages, [], 0), negotiation.decide(messages, [a, g], 1)
    assert [x.mine for x in joined.agreed] == [None, None] and joined.joined == [0] == working.joined
    assert negotiation.dtype_of(joined.agreed[0].row) == torch.float64
    assert negotiation.field_of(joined.agreed[0].row, "numel") == 3
    assert working.agreed[0].refused == "" and "joined (hvd.join())" in working.agreed[1].refused
    assert working.agreed[0].inline is None  # (the joined rank carries no bytes)
    done = [negotiation.encode([], head=negotiation.Head(joined=True, joined_at=j)) for j in (3, 7, 7)]
    assert all(negotiation.decide(done, [], r).last_joined == 2 for r in range(3))


def test_an_in_place_allreduce_reduces_in_place_and_never_goes_around_the_ring_from_itself() -> None:
    """`hvd.allreduce_` passes `tensor.data` twice (two objects, one memory): it once took the
    out-of-place path, summing from the tensor into itself around Ringmaster's ring (a thread and
    2(n-1) transfers per call: 4 MB in 6.5 ms where Gloo's in-place allreduce takes 2.9 ms)."""
    n = 3

    def work(comm: Communicator) -> tuple[torch.Tensor, bool, torch.Tensor]:
        tensor = torch.full((1 << 20,), float(comm.rank + 1))  # 4 MB: the ring's size for new tensors
        run(comm, ops.allreduce(tensor.data, tensor.data, ops.Sum, 1.0, 1.0, None))
        broadcast = torch.full((1 << 20,), float(comm.rank))
        run(comm, ops.broadcast(broadcast.data, broadcast.data, 2, None))
        return tensor, comm._ring_sum is not None, broadcast

    for tensor, ring_made, broadcast in on_ranks(n, work):
        assert torch.equal(tensor, torch.full((1 << 20,), 6.0))
        assert not ring_made, "an in-place float32 sum went around Ringmaster's ring"
        assert torch.equal(broadcast, torch.full((1 << 20,), 2.0))


def test_large_tensors_queued_together_are_reduced_alone_and_small_ones_fused(monkeypatch) -> None:
    """Fusing a tensor of a few MB costs two copies of it, more than the collective it saves
    (8 allreduces of 4 MB queued together: 65 ms fused, 44 ms each alone)."""
    from ringmaster.worker.train.op_queue import FUSE_TENSOR_LIMIT_BYTES

    calls = count_allreduce_sizes(monkeypatch)
    large = FUSE_TENSOR_LIMIT_BYTES // 4

    def work(comm: Communicator) -> list[list[float]]:
        tensors = [torch.full((large,), float(comm.rank + k)) for k in range(3)]
        tensors += [torch.full((k + 1,), float(comm.rank + k)) for k in range(3)]
        queued = [ops.allreduce(t, t, ops.Sum, 1.0, 1.0, f"t{k}") for k, t in enumerate(tensors)]
        submit_together(comm, queued)
        return [sorted(set(o.outcome().tolist())) for o in queued]

    results = on_ranks(2, work)
    assert results[0] == results[1] == [[float(1 + 2 * k)] for k in range(3)] * 2
    assert sorted(c for c in calls if c > 1) == [6, 6] + [large] * 6, calls  # per rank: 3 large alone, 3 small as one


def test_operations_queued_together_go_out_back_to_back_and_settle_in_order(monkeypatch) -> None:
    """Allreduces and broadcasts queued together are all started before the first is waited for
    (each waiting for the queue's thread between them left the ring idle: 8 x 4 MB async
    allreduces hid 38-49% of themselves behind compute where torch.distributed's hid 70-85%); an
    operation that cannot be left in flight (an allgather) waits for those started before it."""
    events: list[tuple[str, int]] = []
    original = Communicator.allreduce_async_

    def logging_start(self: Communicator, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> Any:
        pending = original(self, tensor, op)
        if self.rank == 0 and tensor.numel() > 1:  # (not the blocker's)
            events.append(("start", tensor.numel()))
            wait = pending.wait

            def logged_wait() -> None:
                events.append(("wait", tensor.numel()))
                wait()

            pending.wait = logged_wait  # type: ignore[method-assign]
        return pending

    monkeypatch.setattr(Communicator, "allreduce_async_", logging_start)
    monkeypatch.setenv(INLINE_BYTES_ENV, "0")  # (the small broadcast and allgather as collectives too)
    large = (2 << 20) // 4  # each reduced alone

    def work(comm: Communicator) -> tuple[list[Any], list[float]]:
        tensors = [torch.full((large + k,), float(comm.rank + k)) for k in range(3)]
        queued = [ops.allreduce(t, t, ops.Sum, 1.0, 1.0, f"a{k}") for k, t in enumerate(tensors)]
        root = torch.full((4,), float(comm.rank))
        queued.append(ops.broadcast(root, root, 1, "b"))
        queued.append(ops.allgather(torch.full((2,), float(comm.rank)), "g"))
        after = torch.full((large + 3,), 1.0)
        queued.append(ops.allreduce(after, after, ops.Average, 1.0, 1.0, "a3"))
        submit_together(comm, queued)
        outcomes = [o.outcome() for o in queued]
        return [sorted(set(t.tolist())) for t in outcomes], [o.ended_at for o in queued]

    results = on_ranks(2, work)
    for values, ended in results:
        assert values == [[1.0], [3.0], [5.0], [1.0], [0.0, 1.0], [1.0]]
        assert ended == sorted(ended), "operations settled out of order"
    sizes = [large, large + 1, large + 2]
    assert events[:6] == [("start", n) for n in sizes] + [("wait", n) for n in sizes], events
    assert events[6:] == [("start", large + 3), ("wait", large + 3)], events


def _every_kind(comm: Communicator) -> list[Operation]:
    """One small operation of each kind that can ride in the negotiation round, on 3 ranks."""
    r = comm.rank
    return [
        ops.allreduce(torch.tensor([r + 1.0, 2.0 * r]), torch.empty(2), ops.Average, 1.0, 1.0, "avg"),
        ops.allreduce(torch.tensor([3 + r, -3], dtype=torch.int32), torch.empty(2, dtype=torch.int32), ops.Sum, 0.5,
                      2.0, None),
        ops.allreduce(torch.tensor([r == 1, True]), torch.empty(2, dtype=torch.bool), ops.Min, 1.0, 1.0, None),
        ops.allgather(torch.full((r + 1, 2), r, dtype=torch.float16), "g"),
        ops.broadcast(torch.full((2, 2), float(r)), torch.empty(2, 2), 2, None),
        ops.alltoall(torch.arange(6, dtype=torch.int64) + 10 * r, [r, 1, 0], 3, None),
        ops.reducescatter(torch.arange(7.0) * (r + 1), ops.Sum, 1.0, 1.0, None),
    ]


def _as_lists(result: Any) -> Any:
    if isinstance(result, torch.Tensor):
        return (str(result.dtype), result.tolist())
    if isinstance(result, (tuple, list)):
        return [_as_lists(r) for r in result]
    return result


def test_small_operations_are_done_in_the_negotiation_round_alone_with_the_collectives_results(monkeypatch) -> None:
    """A small operation's bytes ride in the round's allgather, and every rank computes the result
    from every rank's bytes: one collective instead of two (a tiny allreduce 0.28 ms, as
    torch.distributed's own, instead of two round trips), the same result as the collective's."""
    started = count_collectives(monkeypatch)

    def work(comm: Communicator) -> tuple[list[Any], list[Any]]:
        inline = [_as_lists(run(comm, operation)) for operation in _every_kind(comm)]
        comm.ops.drain()
        comm.ops.inline_bytes, comm.ops.sends_early = 0, False  # the same operations, each a collective of its own
        collective = [_as_lists(run(comm, operation)) for operation in _every_kind(comm)]
        return inline, collective

    results = on_ranks(3, work)
    kinds = len(results[0][0])
    inline_rounds = started[: 3 * kinds]
    assert inline_rounds == ["allgather"] * (3 * kinds), started  # each: the round's allgather, nothing more
    assert len(started) >= 3 * kinds + 3 * (2 * kinds), "each is a round and a collective"
    for inline, collective in results:
        assert inline == collective
    (first, _), (second, _), (third, _) = results
    assert first[0] == ("torch.float32", [2.0, 2.0]) and first[1] == ("torch.int32", [10, -6])
    assert first[2] == ("torch.bool", [False, True]) and first[4] == ("torch.float32", [[2.0, 2.0]] * 2)
    assert first[3] == second[3] == third[3] == ("torch.float16", [[0.0] * 2] + [[1.0] * 2] * 2 + [[2.0] * 2] * 3)
    assert first[5] == [("torch.int64", [10, 20, 21]), ("torch.int32", [0, 1, 2])]  # rank 0: rank r's first r rows
    assert [r[6][1] for r in (first, second, third)] == [[0.0, 6.0, 12.0], [18.0, 24.0], [30.0, 36.0]]


def test_operations_past_the_inline_budget_are_collectives_beside_small_ones_done_inline(monkeypatch) -> None:
    from ringmaster.worker.train.negotiation import INLINE_AREA_BYTES

    started = count_collectives(monkeypatch)
    big = INLINE_AREA_BYTES // 4 + 1  # float32 elements: one byte past the area

    def work(comm: Communicator) -> list[Any]:
        queued = [ops.allreduce(torch.full((3,), 1.0 + comm.rank), torch.empty(3), ops.Sum, 1.0, 1.0, "small"),
                  ops.allgather(torch.full((big,), float(comm.rank)), "big"),
                  ops.allreduce(torch.full((INLINE_AREA_BYTES // 8,), 1.0), torch.empty(INLINE_AREA_BYTES // 8),
                                ops.Sum, 1.0, 1.0, "half"),
                  ops.allreduce(torch.full((INLINE_AREA_BYTES // 8,), 2.0), torch.empty(INLINE_AREA_BYTES // 8),
                                ops.Sum, 1.0, 1.0, "past-the-rest")]
        submit_together(comm, queued)
        return [o.outcome() for o in queued]

    for small, gathered, half, rest in on_ranks(2, work):
        assert small.tolist() == [3.0] * 3 and gathered.tolist() == [0.0] * big + [1.0] * big
        assert set(half.tolist()) == {2.0} and set(rest.tolist()) == {4.0}
    assert started.count("allreduce") == 2 * 2, started  # per rank: the blocker's and "past-the-rest"'s
    assert started.count("allgather") == 2 * 3, started  # per rank: 2 rounds' allgathers and "big"'s


def test_the_negotiation_carries_small_operations_only_where_every_rank_did() -> None:
    a = Descriptor(Kind.ALLREDUCE, (torch.ones(3),), op=1, name="a")
    b = Descriptor(Kind.ALLREDUCE, (torch.ones(2),), op=1, name="b")
    mine, theirs = torch.tensor([1, 2, 3], dtype=torch.uint8), torch.tensor([7, 8, 9, 10], dtype=torch.uint8)
    # rank 0 carries only b; rank 1 carries a (4 bytes) and b: b's bytes sit at each rank's own offset
    messages = [negotiation.encode([a, b], [None, mine]), negotiation.encode([a, b], [torch.ones(4, dtype=torch.uint8),
                                                                                  theirs])]
    verdict = negotiation.decide(messages, [a, b], 0)
    assert [x.refused for x in verdict.agreed] == ["", ""] and verdict.agreed[0].inline is None
    assert [p.tolist() for p in verdict.agreed[1].inline] == [[1, 2, 3], [7, 8, 9, 10]]
    # queued in another order, each rank's bytes are still found at its own offsets
    crossed = [negotiation.encode([a, b], [None, mine]), negotiation.encode([b, a], [theirs, None])]
    assert [p.tolist() for p in negotiation.decide(crossed, [a, b], 0).agreed[1].inline] == [[1, 2, 3],
                                                                                           [7, 8, 9, 10]]
    # a refused operation is never done inline; a row claiming more bytes than the area holds is ignored
    other = Descriptor(Kind.ALLREDUCE, (torch.ones(5),), op=1, name="a")
    refused = negotiation.decide([negotiation.encode([a], [mine]), negotiation.encode([other], [mine])], [a], 0)
    assert refused.agreed[0].refused and refused.agreed[0].inline is None
    hostile = negotiation.encode([a], [mine])
    hostile[len(negotiation.HEADER) + negotiation.FIELDS.index("inline")] = negotiation.INLINE_AREA_BYTES + 1
    assert negotiation.decide([negotiation.encode([a], [mine]), hostile], [a], 0).agreed[0].inline is None
    assert len(negotiation.encode([a])) == len(hostile) == negotiation.MESSAGE_WORDS


def test_a_barrier_is_agreed_on_then_carried_out_as_a_collective_of_its_own(monkeypatch) -> None:
    """As Horovod's: never inline. Inline, a barrier was its round alone, and Horovod's
    `test_global_barrier_op` (rank 0 sleeps 5 s, every rank's barrier must take 5 s from its own
    clock) failed once on a loaded machine: a rank can leave one round a moment after its peers."""
    started = count_collectives(monkeypatch)

    def work(comm: Communicator) -> None:
        run(comm, ops.barrier())

    on_ranks(2, work)
    assert started.count("allgather") == 2 and started.count("allreduce") == 2, started
