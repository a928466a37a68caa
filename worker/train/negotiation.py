"""Agreeing on the next collectives, pure: what each rank queued, described in a few integers,
and which of them every rank can run together.

Horovod's coordinator matches operations by name before running them, so ranks that disagree
(another shape, dtype or op) get an error instead of a broken ring. Here every rank's op thread
describes up to `BATCH` queued operations in one fixed-size row of integers; the rows are
allgathered (one small collective), and each rank decides the same thing from the same rows:
how many operations all ranks have queued (the common prefix), and which of those disagree.
Those fail on every rank with a message naming the difference; the others run, and the ring
stays in step because no rank sends bytes another does not expect.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Sequence

import torch

#: Operations described per negotiation round (more wait for the next round).
BATCH = 32


class Kind(IntEnum):
    ALLREDUCE = 1
    ALLGATHER = 2
    BROADCAST = 3
    ALLTOALL = 4
    REDUCESCATTER = 5
    BARRIER = 6
    GROUPED_ALLREDUCE = 7
    GROUPED_ALLGATHER = 8
    GROUPED_REDUCESCATTER = 9


#: Fields of one operation's row, in order.
FIELDS = ("kind", "dtype", "device", "op", "root", "ndim", "dim0", "shape", "name", "prescale", "postscale", "count")
WIDTH = len(FIELDS)
#: Kinds whose tensors may differ in their first dimension between ranks.
FIRST_DIM_FREE = {Kind.ALLGATHER, Kind.ALLTOALL, Kind.GROUPED_ALLGATHER}


def _digest(text: str) -> int:
    """A stable signed 63-bit digest (Python's own hash differs between processes)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _float_bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def _dtype_code(dtype: torch.dtype) -> int:
    return _digest(str(dtype)) & 0xFFFF


@dataclass(frozen=True)
class Descriptor:
    """One queued operation as every rank must see it. `tensors` are described by dtype and
    shape; for grouped operations all tensors count (`count` of them)."""

    kind: Kind
    tensors: tuple[torch.Tensor, ...]
    op: int = 0
    root: int = -1
    name: str | None = None
    prescale: float = 1.0
    postscale: float = 1.0

    def row(self) -> list[int]:
        first = self.tensors[0] if self.tensors else None
        free = self.kind in FIRST_DIM_FREE
        shapes = ";".join(f"{t.dtype}:{tuple(t.shape[1:]) if free else tuple(t.shape)}" for t in self.tensors)
        return [
            int(self.kind),
            _dtype_code(first.dtype) if first is not None else 0,
            int(first.is_cuda) if first is not None else 0,
            self.op,
            self.root,
            first.dim() if first is not None else 0,
            int(first.shape[0]) if first is not None and first.dim() > 0 else 0,
            _digest(shapes),
            _digest(self.name) if self.name else 0,
            _float_bits(self.prescale),
            _float_bits(self.postscale),
            len(self.tensors),
        ]


def encode(descriptors: Sequence[Descriptor]) -> torch.Tensor:
    """A rank's message: how many it describes, then `BATCH` rows (unused ones zero)."""
    assert len(descriptors) <= BATCH
    message = torch.zeros(1 + BATCH * WIDTH, dtype=torch.int64)
    message[0] = len(descriptors)
    for i, d in enumerate(descriptors):
        message[1 + i * WIDTH: 1 + (i + 1) * WIDTH] = torch.tensor(d.row(), dtype=torch.int64)
    return message


@dataclass(frozen=True)
class Verdict:
    """What every rank decided from the same rows: the first `count` queued operations go now;
    those in `refused` (index -> why) fail on every rank instead of running. `first_dims` gives,
    for operations whose first dimension may differ, each rank's (an allgather needs no round
    of its own to learn them)."""

    count: int
    refused: dict[int, str]
    first_dims: dict[int, list[int]] = field(default_factory=dict)


def decide(messages: Sequence[torch.Tensor], descriptors: Sequence[Descriptor], rank: int) -> Verdict:
    """The common prefix of every rank's queue, and which of its operations disagree.

    `messages` are every rank's `encode` output in rank order; `descriptors` this rank's own
    (for the words of an error: the others are known only by their rows)."""
    counts = [int(m[0]) for m in messages]
    count = min(counts)
    refused: dict[int, str] = {}
    first_dims: dict[int, list[int]] = {}
    for i in range(count):
        rows = [m[1 + i * WIDTH: 1 + (i + 1) * WIDTH].tolist() for m in messages]
        why = _disagreement(rows, descriptors[i], rank)
        if why:
            refused[i] = why
        elif descriptors[i].kind in FIRST_DIM_FREE:
            first_dims[i] = [row[FIELDS.index("dim0")] for row in rows]
    return Verdict(count, refused, first_dims)


def _disagreement(rows: list[list[int]], mine: Descriptor, rank: int) -> str:
    """Why the ranks' rows for one operation cannot run together ('' if they can)."""
    ours = rows[rank]
    what = f"{Kind(ours[0]).name.lower()}" + (f" {mine.name!r}" if mine.name else "")
    for other, row in enumerate(rows):
        differing = [f for f, a, b in zip(FIELDS, ours, row) if a != b and not _may_differ(f, mine.kind, ours, row)]
        if differing:
            return (f"{what}: rank {other} {_difference(differing[0], row, ours, mine)} (ranks must issue the same "
                    "collectives in the same order)")
    return ""


def _may_differ(field: str, kind: Kind, ours: list[int], row: list[int]) -> bool:
    if field == "dim0":
        return kind in FIRST_DIM_FREE
    if field == "name":  # an unnamed operation matches any name (Horovod names those itself)
        return ours[FIELDS.index("name")] == 0 or row[FIELDS.index("name")] == 0
    return False


def _difference(field: str, theirs: list[int], ours: list[int], mine: Descriptor) -> str:
    at = FIELDS.index(field)
    if field == "kind":
        return f"called {Kind(theirs[at]).name.lower()} at this point" if theirs[at] in Kind._value2member_map_ \
            else "called another collective at this point"
    if field in ("ndim", "dim0"):
        return f"gave a tensor with {field} {theirs[at]}, this rank {ours[at]} (shape {tuple(mine.tensors[0].shape)})"
    if field == "shape":
        return f"gave tensors of other shapes than this rank's {[tuple(t.shape) for t in mine.tensors]}"
    if field == "dtype":
        return f"gave another dtype than this rank's {mine.tensors[0].dtype}"
    if field == "device":
        return "gave a tensor on another kind of device (CPU against CUDA)"
    if field == "name":
        return f"named it differently (this rank: {mine.name!r})"
    if field in ("prescale", "postscale"):
        value = struct.unpack("<d", struct.pack("<q", theirs[at]))[0]
        return f"gave {field}_factor {value:g}, this rank {getattr(mine, field):g}"
    if field == "root":
        return f"gave root_rank {theirs[at]}, this rank {ours[at]}"
    if field == "op":
        return "asked for another reduction op"
    return f"gave another {field}"
