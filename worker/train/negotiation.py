"""Agreeing on the next collectives, pure: what each rank queued, described in a few integers,
and which of them every rank can run together.

Horovod's coordinator matches operations by name before running them, so ranks that disagree
(another shape, dtype or op) get an error instead of a broken ring. Here every rank's op thread
describes up to `BATCH` queued operations in one fixed-size row of integers; the rows are
allgathered (one small collective), and each rank decides the same thing from the same rows:
how many operations all ranks have queued (the common prefix), and which of those disagree.
Those fail on every rank with a message naming the difference; the others run, and the ring
stays in step because no rank sends bytes another does not expect.

Small operations ride in the round itself: each message ends in a fixed area of
`INLINE_AREA_BYTES` where a rank puts the bytes of its small operations (a metric to average, a
few sizes to gather, a barrier's nothing), each row saying how many (`inline`, -1 for none). An
operation that every rank inlined and that all agree on is done from the gathered bytes alone
(`Verdict.inline`): one collective instead of two, as fast as the collective itself. The area's
size is fixed, so every rank's message has the same size whatever it inlines.

Between the rows and the inline area, each message says what its first operation sent early
(`speculation.Announcement`: the bytes sent to and expected from each rank), so that every rank
can complete every transfer of the round (`early_data`).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Sequence

import torch

from ringmaster.worker.train import speculation
from ringmaster.worker.train.speculation import Announcement

#: Operations described per negotiation round (more wait for the next round).
BATCH = 32
#: Bytes at the end of every rank's message for the small operations' own bytes (a multiple of 8).
#: Measured on 2 ranks: an allgather of the 3 KB message without it and of 7 KB with it take the
#: same time (0.28 ms); 19 KB takes 0.30 ms.
INLINE_AREA_BYTES = 4096


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
FIELDS = ("kind", "dtype", "device", "op", "root", "ndim", "dim0", "shape", "name", "prescale", "postscale", "count",
          "inline")
WIDTH = len(FIELDS)
#: Words saying what the round's first operation sent early (`speculation.Announcement`).
EARLY_WORDS = 2 * speculation.ANNOUNCED_RANKS
#: Where the inline area begins.
_AREA_AT = 1 + BATCH * WIDTH + EARLY_WORDS
#: The message: how many operations it describes, `BATCH` rows, the early data's announcement,
#: the inline area.
MESSAGE_WORDS = _AREA_AT + INLINE_AREA_BYTES // 8
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

    def row(self, inline: int = -1) -> list[int]:
        """The operation's integers; `inline`: how many of its bytes the message carries (-1: none)."""
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
            inline,
        ]


def encode(descriptors: Sequence[Descriptor], inline: Sequence[torch.Tensor | None] = (),
           early: Announcement | None = None) -> torch.Tensor:
    """A rank's message: how many it describes, then `BATCH` rows (unused ones zero), then what
    the first operation sent early (`early`; none when None), then the inline area with the bytes
    of each operation that has a tensor in `inline` (1-D uint8, in order; together at most
    `INLINE_AREA_BYTES`)."""
    assert len(descriptors) <= BATCH
    message = torch.zeros(MESSAGE_WORDS, dtype=torch.int64)
    message[0] = len(descriptors)
    words = (early or Announcement.silent(0)).words()
    message[1 + BATCH * WIDTH: _AREA_AT] = torch.tensor(words, dtype=torch.int64)
    area = message[_AREA_AT:].view(torch.uint8)
    rows, used = [], 0
    for i, d in enumerate(descriptors):
        payload = inline[i] if i < len(inline) else None
        if payload is None:
            rows.append(d.row())
            continue
        assert used + payload.numel() <= INLINE_AREA_BYTES
        area[used: used + payload.numel()] = payload
        used += payload.numel()
        rows.append(d.row(payload.numel()))
    if rows:
        message[1: 1 + len(rows) * WIDTH] = torch.tensor(rows, dtype=torch.int64).reshape(-1)
    return message


@dataclass(frozen=True)
class Verdict:
    """What every rank decided from the same rows: the first `count` queued operations go now;
    those in `refused` (index -> why) fail on every rank instead of running. `first_dims` gives,
    for operations whose first dimension may differ, each rank's (an allgather needs no round
    of its own to learn them). `inline` gives, for operations that every rank carried in its
    message, each rank's bytes of it (uint8, rank order): they are done without a collective."""

    count: int
    refused: dict[int, str]
    first_dims: dict[int, list[int]] = field(default_factory=dict)
    inline: dict[int, list[torch.Tensor]] = field(default_factory=dict)


def decide(messages: Sequence[torch.Tensor], descriptors: Sequence[Descriptor], rank: int) -> Verdict:
    """The common prefix of every rank's queue, and which of its operations disagree.

    `messages` are every rank's `encode` output in rank order; `descriptors` this rank's own
    (for the words of an error: the others are known only by their rows)."""
    counts = [int(m[0]) for m in messages]
    count = max(0, min(min(counts), BATCH))  # (a message never describes more than BATCH)
    refused: dict[int, str] = {}
    first_dims: dict[int, list[int]] = {}
    inline: dict[int, list[torch.Tensor]] = {}
    table = [m[1: 1 + count * WIDTH].view(count, WIDTH).tolist() for m in messages]  # (the rows all agreed on)
    areas = [m[_AREA_AT:].view(torch.uint8) for m in messages]
    offsets = [0] * len(messages)  # where each rank's next inline bytes begin
    at = FIELDS.index("inline")
    for i in range(count):
        rows = [t[i] for t in table]
        why = _disagreement(rows, descriptors[i], rank)
        if why:
            refused[i] = why
        elif descriptors[i].kind in FIRST_DIM_FREE:
            first_dims[i] = [row[FIELDS.index("dim0")] for row in rows]
        sizes = [row[at] for row in rows]
        if not why and all(0 <= n <= INLINE_AREA_BYTES - o for n, o in zip(sizes, offsets)):
            inline[i] = [area[o: o + n] for area, o, n in zip(areas, offsets, sizes)]
        offsets = [o + max(n, 0) for o, n in zip(offsets, sizes)]
    return Verdict(count, refused, first_dims, inline)


def announcements(messages: Sequence[torch.Tensor]) -> list[Announcement]:
    """What each rank's message (rank order) says its first operation sent early, checked
    (ValueError naming the rank whose message is impossible)."""
    size = len(messages)
    return [Announcement.from_words(m[1 + BATCH * WIDTH: _AREA_AT].tolist(), size, rank)
            for rank, m in enumerate(messages)]


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
    if field == "inline":  # (each rank carries what it can; `decide` looks at all of them)
        return True
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
