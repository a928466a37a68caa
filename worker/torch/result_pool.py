"""Memory for the results of out-of-place reductions, reused once nobody holds them.

`hvd.allreduce`, `hvd.allgather` and `hvd.alltoall` return new tensors. A new tensor of more
than 32 MB is fresh memory from the kernel every time (glibc maps such blocks anew and unmaps
them when freed): its first touch faults in every page, which on a VM costs more than the
reduction itself (45-50 ms for 64 MB here, against 60-70 ms for the allreduce). Smaller ones
fault too once other work has moved the heap's top: a 2 MB allgather result, alternated with
other collectives, took 208 page faults a call (0.9 ms of a 2.1 ms `hvd.allgather` of 1 MB per
rank; 2 faults from the pool). The pool keeps a few buffers and hands one out again only when
torch counts no reference to its storage but the pool's own: a result the caller still holds,
or any view of it, is never overwritten. Bounded in count and bytes.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch

#: Smaller results come from the allocator as usual (a few pages: faulting them in costs little).
MIN_BYTES = 256 << 10
#: At most this many buffers and this many bytes are kept (the oldest free ones go first).
MAX_BUFFERS = 4
MAX_BYTES = 512 << 20


def _storage_users() -> Callable[[torch.Tensor], int] | None:
    """How many references a tensor's storage has (torch's own count), or None where this torch
    cannot tell: then nothing is pooled."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    # The count includes the temporary Python storage object made to ask; measured, not assumed.
    probe = torch.empty(1)
    baseline = count(probe.untyped_storage()._cdata)
    return lambda t: count(t.untyped_storage()._cdata) - baseline + 1


class ResultPool:
    """Buffers for new result tensors, per (dtype, number of elements), on the CPU."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []  # oldest first
        self._users = _storage_users()
        # Rings run their operations on threads of their own (a process set's beside the
        # generation's): a free buffer is looked for and handed out under the lock, or two
        # threads could both find it free and write into one result.
        self._lock = threading.Lock()

    def empty_like(self, source: torch.Tensor) -> torch.Tensor:
        """An uninitialized contiguous tensor shaped like `source`: a free pooled buffer, or a new one."""
        return self.empty(tuple(source.shape), source.dtype, source.device)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialized contiguous tensor of `shape`: a free pooled buffer, or a new one."""
        numel = 1
        for dim in shape:
            numel *= dim
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        if self._users is None or torch.device(device).type != "cpu" or nbytes < MIN_BYTES or nbytes > MAX_BYTES:
            return torch.empty(shape, dtype=dtype, device=device)
        with self._lock:
            for i, buffer in enumerate(self._buffers):
                if buffer.dtype == dtype and buffer.numel() == numel and self._free(buffer):
                    self._buffers.append(self._buffers.pop(i))  # by position: tensors compare elementwise
                    return buffer.view(shape)  # (the view counts as a user before the lock is let go)
            buffer = torch.empty(numel, dtype=dtype, device=device)
            self._buffers.append(buffer)
            self._trim()
            return buffer.view(shape)

    def _free(self, buffer: torch.Tensor) -> bool:
        assert self._users is not None
        return self._users(buffer) == 1  # the pool's own reference only

    def _trim(self) -> None:
        """Drop the oldest buffers beyond the bounds (a buffer still in use just stops being pooled)."""
        while len(self._buffers) > MAX_BUFFERS or sum(b.numel() * b.element_size() for b in self._buffers) > MAX_BYTES:
            self._buffers.pop(0)

    def __len__(self) -> int:
        return len(self._buffers)
