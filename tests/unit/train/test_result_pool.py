"""New results of out-of-place reductions reuse memory only once nobody holds it."""

from __future__ import annotations

import resource

import torch

import ringmaster.torch as hvd
from ringmaster.torch.result_pool import MAX_BUFFERS, MIN_BYTES, ResultPool


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_a_dropped_result_is_reused_and_a_held_one_or_its_view_never_is(alone) -> None:
    source = torch.full((16 << 20,), 2.0)  # 64 MB
    first = hvd.allreduce(source)
    address = first.data_ptr()
    del first
    before = _faults()
    second = hvd.allreduce(source)
    assert second.data_ptr() == address  # reused: no fresh memory to fault in
    assert _faults() - before < 1000  # a fresh 64 MB is 16384 faults
    assert torch.equal(second, source)
    third = hvd.allreduce(source * 3)  # the second is still held: another buffer
    assert third.data_ptr() != second.data_ptr() and torch.equal(second, source)
    kept = third[:4]  # a view keeps the third's memory in use after the third is gone
    del third
    fourth = hvd.allreduce(source * 5)
    assert fourth.data_ptr() not in (address, kept.data_ptr())
    assert kept.tolist() == [6.0] * 4 and torch.equal(second, source)


def test_small_results_and_other_shapes_are_not_pooled_and_the_pool_is_bounded() -> None:
    pool = ResultPool()
    small = pool.empty_like(torch.zeros(10))
    assert len(pool) == 0 and small.shape == (10,)
    big = torch.zeros(MIN_BYTES // 4 + 1)
    held = [pool.empty_like(big) for _ in range(MAX_BUFFERS + 2)]  # all held: new ones, oldest dropped
    assert len(pool) == MAX_BUFFERS and len({t.data_ptr() for t in held}) == MAX_BUFFERS + 2
    shaped = pool.empty_like(big.view(1, -1))  # every buffer is held: a new one
    assert shaped.shape == (1, big.numel()) and shaped.data_ptr() not in {t.data_ptr() for t in held}
    held.clear()
    del shaped
    again = pool.empty_like(big.view(-1, 1))  # now free: reused, reshaped
    assert again.shape == (big.numel(), 1) and len(pool) == MAX_BUFFERS
    assert any(again.data_ptr() == b.data_ptr() for b in pool._buffers)


def test_buffers_of_several_sizes_are_found_by_size() -> None:
    pool = ResultPool()
    small, large = torch.zeros(MIN_BYTES // 4), torch.zeros(MIN_BYTES // 2)
    a, b = pool.empty_like(small), pool.empty_like(large)
    addresses = (a.data_ptr(), b.data_ptr())
    del a, b
    assert (pool.empty_like(small).data_ptr(), pool.empty_like(large).data_ptr()) == addresses  # the newest used last
    assert pool.empty_like(large).data_ptr() == addresses[1] and len(pool) == 2


def test_a_dropped_allgather_or_alltoall_result_of_a_megabyte_is_reused(alone) -> None:
    """Results from 256 KB on come from the pool: a 1 MB one alternated with other work faulted
    in fresh pages every call (208 faults a call measured, 2 from the pool)."""
    part = torch.ones(1 << 18)  # 1 MB
    first = hvd.allgather(part)
    address = first.data_ptr()
    del first
    other = torch.empty(1 << 18)  # (from the allocator, this would take the memory just freed)
    assert hvd.allgather(part).data_ptr() == address
    swapped = hvd.alltoall(part)
    address = swapped.data_ptr()
    del swapped
    more = torch.empty(1 << 18)
    assert hvd.alltoall(part).data_ptr() == address
    assert other.data_ptr() != address and more.data_ptr() != address


def test_threads_asking_at_once_never_get_one_buffer() -> None:
    """Rings run their operations on threads of their own: two asking at once were both handed
    the one free buffer (seen as a wrong alltoall result on a ring of three threads). Here the
    first thread stops right after finding the free buffer, until the second has been given
    one (or for 0.5 s, when the second is held back as it must be)."""
    import threading

    from ringmaster.torch.result_pool import ResultPool

    pool = ResultPool()
    del_me = pool.empty((1 << 16,), torch.float32, torch.device("cpu"))
    del del_me  # one free buffer in the pool
    found, second_given = threading.Event(), threading.Event()
    free = pool._free

    def free_then_pause(buffer: torch.Tensor) -> bool:
        is_free = free(buffer)
        if is_free and threading.current_thread().name == "first":
            found.set()
            second_given.wait(0.5)
        return is_free

    pool._free = free_then_pause  # type: ignore[method-assign]
    got: dict[str, torch.Tensor] = {}

    def ask(name: str) -> None:
        got[name] = pool.empty((1 << 16,), torch.float32, torch.device("cpu"))
        if name == "second":
            second_given.set()

    first = threading.Thread(target=ask, args=("first",), name="first")
    first.start()
    assert found.wait(10)
    second = threading.Thread(target=ask, args=("second",), name="second")
    second.start()
    for thread in (first, second):
        thread.join(10)
    assert got["first"].data_ptr() != got["second"].data_ptr(), "one buffer was handed to both threads"
