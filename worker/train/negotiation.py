"""Agreeing on the next collectives, pure: what each rank queued, described in a few integers,
and which of them every rank can run together.

Horovod's coordinator matches operations by name before running them, so ranks may issue named
operations in different orders (their own hooks firing in another order, as dynamic graphs do),
and ranks that disagree (another shape, dtype or op) get an error instead of a broken ring. Here
every rank's op thread describes up to `BATCH` queued operations in one fixed-size row of
integers each; the rows are allgathered (one small collective), and each rank decides the same
thing from the same rows: which operations every rank has queued, matched by name (an unnamed
operation by its place among the ring's unnamed ones, as Horovod's generated names do), in the
order the first waiting rank queued them, and which of those disagree. Those fail on every rank
with a message naming the difference; the others run, and the ring stays in step because no
rank sends bytes another does not expect. An operation that some rank never issues is given up
on every rank once a rank has waited the collective timeout for it (`Head.stalled`), with what
each rank waited for.

`hvd.join()` is a rank saying it has no more data (`Head.joined`): the others' allreduces and
barriers go on without it, the joined rank taking part with the reduction's identity (zeros for
a sum, as Horovod's joined ranks do), and once every rank has joined, each learns which joined
last (what `hvd.join()` returns).

Small operations ride in the round itself: each message ends in a fixed area of
`INLINE_AREA_BYTES` where a rank puts the bytes of its small operations (a metric to average, a
few sizes to gather, a barrier's nothing), each row saying how many (`inline`, -1 for none). An
operation that every rank inlined and that all agree on is done from the gathered bytes alone
(`Agreed.inline`): one collective instead of two, as fast as the collective itself. The area's
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
    JOIN = 10


class Reduction(IntEnum):
    """The reduction an operation asks for (its row's `op`), by Horovod's names."""

    SUM = 1
    AVERAGE = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5
    ADASUM = 6


#: Fields of one operation's row, in order. `name` is a digest of its name (0: unnamed) and
#: `seq` an unnamed operation's place among its ring's unnamed operations (-1: named): together
#: the key by which the ranks' operations are matched. `numel`: its elements, all tensors together.
FIELDS = ("kind", "dtype", "device", "op", "root", "ndim", "dim0", "shape", "name", "seq", "numel", "prescale",
          "postscale", "count", "inline")
WIDTH = len(FIELDS)
_AT = {name: i for i, name in enumerate(FIELDS)}
#: Words at the head of every message (`Head`).
HEADER = ("count", "joined", "joined_at", "stalled", "next_seq")
_HEAD = len(HEADER)
#: Words saying what the round's first operation sent early (`speculation.Announcement`).
EARLY_WORDS = 2 * speculation.ANNOUNCED_RANKS
#: Where the early data's announcement and the inline area begin.
_EARLY_AT = _HEAD + BATCH * WIDTH
_AREA_AT = _EARLY_AT + EARLY_WORDS
#: The message: its header, `BATCH` rows, the early data's announcement, the inline area.
MESSAGE_WORDS = _AREA_AT + INLINE_AREA_BYTES // 8
#: Kinds whose tensors may differ in their first dimension between ranks.
FIRST_DIM_FREE = {Kind.ALLGATHER, Kind.ALLTOALL, Kind.GROUPED_ALLGATHER}
#: Kinds that go on while a rank has joined (the joined rank stands in for them: `Agreed.mine` None).
WHILE_JOINED = {Kind.ALLREDUCE, Kind.BARRIER}


def _digest(text: str) -> int:
    """A stable signed 63-bit digest (Python's own hash differs between processes)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _float_bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def float_of(bits: int) -> float:
    """A row's prescale or postscale as the number it is."""
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def _dtype_code(dtype: torch.dtype) -> int:
    return _digest(str(dtype)) & 0xFFFF


#: Every dtype by its code in a row (a joined rank builds its stand-in from a peer's row).
_DTYPES: dict[int, torch.dtype] = {}
for _value in vars(torch).values():
    if isinstance(_value, torch.dtype):
        _DTYPES.setdefault(_dtype_code(_value), _value)


def dtype_of(row: Sequence[int]) -> torch.dtype | None:
    """The dtype a row describes (None for a code of no dtype known here)."""
    return _DTYPES.get(row[_AT["dtype"]])


def field_of(row: Sequence[int], name: str) -> int:
    """One field of a row, by its name in `FIELDS`."""
    return row[_AT[name]]


@dataclass(frozen=True)
class Descriptor:
    """One queued operation as every rank must see it. `tensors` are described by dtype and
    shape; for grouped operations all tensors count (`count` of them). `seq`: an unnamed
    operation's place among its ring's unnamed ones (its queue gives it; -1 for a named one)."""

    kind: Kind
    tensors: tuple[torch.Tensor, ...]
    op: int = 0
    root: int = -1
    name: str | None = None
    prescale: float = 1.0
    postscale: float = 1.0
    seq: int = -1

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
            -1 if self.name else self.seq,
            sum(int(t.numel()) for t in self.tensors),
            _float_bits(self.prescale),
            _float_bits(self.postscale),
            len(self.tensors),
            inline,
        ]

    def key(self) -> tuple[int, int]:
        """What the ranks' operations are matched by: the name, or the unnamed place."""
        return (_digest(self.name), -1) if self.name else (0, self.seq)

    def what(self) -> str:
        """The operation as an error names it: its kind, and its name or unnamed place."""
        return _what(self.kind, self.name, self.seq)


def _what(kind: int, name: str | None, seq: int) -> str:
    """An operation as errors name it: its kind and name ('allreduce 'grad''), or its kind alone
    (an unnamed one: its place among the ring's unnamed ones says nothing to a user)."""
    word = Kind(kind).name.lower() if kind in Kind._value2member_map_ else "another collective"
    return f"{word} {name!r}" if name else word


def _unnamed(kind: int, seq: int) -> str:
    """An unnamed operation where its place matters (a stall: the places that did not meet)."""
    return f"{_what(kind, None, seq)} (unnamed no. {seq + 1})"


def _row_what(row: Sequence[int], names: dict[tuple[int, int], str]) -> str:
    """A peer's row as an error names it (by its name where this rank issued that name too)."""
    key = _key(row)
    if key[0] == 0:
        return _unnamed(row[0], key[1])
    known = names.get(key)
    return _what(row[0], known, -1) if known else f"{_what(row[0], None, -1)} under another name"


@dataclass(frozen=True)
class Head:
    """A message's header: how many rows it describes; whether the rank has joined
    (`hvd.join()`) and in which round it did (-1: not joined); whether it gives up on what it
    waits for (it waited the collective timeout); the place of its next unnamed operation."""

    count: int = 0
    joined: bool = False
    joined_at: int = -1
    stalled: bool = False
    next_seq: int = 0


def encode(descriptors: Sequence[Descriptor], inline: Sequence[torch.Tensor | None] = (),
           early: Announcement | None = None, head: Head | None = None) -> torch.Tensor:
    """A rank's message: its header (`head`, whose count is `descriptors`'), then `BATCH` rows
    (unused ones zero), then what the first operation sent early (`early`; none when None), then
    the inline area with the bytes of each operation that has a tensor in `inline` (1-D uint8,
    in order; together at most `INLINE_AREA_BYTES`)."""
    assert len(descriptors) <= BATCH
    head = head or Head()
    message = torch.zeros(MESSAGE_WORDS, dtype=torch.int64)
    message[:_HEAD] = torch.tensor([len(descriptors), int(head.joined), head.joined_at, int(head.stalled),
                                    head.next_seq], dtype=torch.int64)
    words = (early or Announcement.silent(0)).words()
    message[_EARLY_AT: _AREA_AT] = torch.tensor(words, dtype=torch.int64)
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
        message[_HEAD: _HEAD + len(rows) * WIDTH] = torch.tensor(rows, dtype=torch.int64).reshape(-1)
    return message


def head_of(message: torch.Tensor) -> Head:
    """A message's header (a count past `BATCH` or below 0 is taken as `BATCH` or 0)."""
    words = message[:_HEAD].tolist()
    return Head(max(0, min(int(words[0]), BATCH)), bool(words[1]), int(words[2]), bool(words[3]), int(words[4]))


@dataclass(frozen=True)
class Agreed:
    """One operation that every rank which has not joined queued, in the round's order.

    `mine`: its index in this rank's rows (None where this rank has joined: it stands in, from
    `row`, the first waiting rank's); `refused`: why it fails on every rank instead of running
    ('' when it runs); `first_dims`: each rank's first dimension, for operations whose first
    dimension may differ (an allgather needs no round of its own to learn them); `inline`: each
    rank's bytes of it when every rank carried it (uint8, rank order: done without a collective)."""

    mine: int | None
    row: tuple[int, ...]
    refused: str = ""
    first_dims: list[int] | None = None
    inline: list[torch.Tensor] | None = None


@dataclass(frozen=True)
class Verdict:
    """What every rank decided from the same messages.

    `agreed`: the operations that go now, in order. `abandoned`: this rank's operations given up
    (index -> why), when some rank stalled: every rank then fails whatever it waited for, and
    the ring's unnamed operations go on from `next_seq` (every rank's furthest). `joined`: the
    ranks that have joined; `last_joined`, once every rank has, the one that joined last.
    `first_shared`: the round's first operation is every rank's first row, so the data it sent
    early is its own."""

    agreed: list[Agreed]
    abandoned: dict[int, str] = field(default_factory=dict)
    joined: list[int] = field(default_factory=list)
    last_joined: int | None = None
    first_shared: bool = False
    stalled: bool = False
    next_seq: int = 0


def alone(descriptors: Sequence[Descriptor], joined: bool) -> Verdict:
    """The verdict of a ring of one: every operation runs, in order; a join is answered at once."""
    return Verdict([Agreed(i, tuple(d.row())) for i, d in enumerate(descriptors)], joined=[0] if joined else [],
                   last_joined=0 if joined else None, first_shared=True)


def _key(row: Sequence[int]) -> tuple[int, int]:
    return row[_AT["name"]], row[_AT["seq"]]


def decide(messages: Sequence[torch.Tensor], descriptors: Sequence[Descriptor], rank: int) -> Verdict:
    """The operations every rank queued, matched by name (an unnamed one by its place), in the
    first waiting rank's order, and which of them disagree.

    `messages` are every rank's `encode` output in rank order; `descriptors` this rank's own
    (for the words of an error: the others are known only by their rows)."""
    heads = [head_of(m) for m in messages]
    tables = [m[_HEAD: _HEAD + h.count * WIDTH].view(h.count, WIDTH).tolist() for m, h in zip(messages, heads)]
    joined = [r for r, h in enumerate(heads) if h.joined]
    waiting = [r for r, h in enumerate(heads) if not h.joined]
    if not waiting:  # every rank has joined: the last to join (the highest rank of one round's)
        last = max(range(len(heads)), key=lambda r: (heads[r].joined_at, r))
        return Verdict([], joined=joined, last_joined=last, next_seq=max(h.next_seq for h in heads))
    index: list[dict[tuple[int, int], int]] = [{} for _ in tables]  # rank -> key -> row (keys in flight are unique)
    for r, table in enumerate(tables):
        for i, row in enumerate(table):
            index[r].setdefault(_key(row), i)
    areas = [m[_AREA_AT:].view(torch.uint8) for m in messages]
    offsets = [_inline_offsets(table) for table in tables]
    agreed: list[Agreed] = []
    seen: set[tuple[int, int]] = set()
    for row in tables[waiting[0]]:
        key = _key(row)
        if key in seen or any(key not in index[r] for r in waiting):
            continue
        seen.add(key)
        rows = {r: tables[r][index[r][key]] for r in waiting}
        mine = index[rank].get(key) if rank in rows else None
        ours = rows[rank] if mine is not None else rows[waiting[0]]
        why = _disagreement(rows, ours, descriptors[mine] if mine is not None else None)
        if not why and joined:
            why = _refused_while_joined(ours, joined, descriptors[mine] if mine is not None else None)
        first_dims = None
        if not why and not joined and ours[0] in FIRST_DIM_FREE:
            first_dims = [table[index[r][key]][_AT["dim0"]] for r, table in enumerate(tables)]
        inline = None
        if not why and not joined:
            spans = [(offsets[r][index[r][key]], table[index[r][key]][_AT["inline"]]) for r, table in enumerate(tables)]
            if all(o is not None and 0 <= n <= INLINE_AREA_BYTES - o for o, n in spans):
                inline = [area[o: o + n] for area, (o, n) in zip(areas, spans)]  # type: ignore[operator]
        agreed.append(Agreed(mine, tuple(ours), why, first_dims, inline))
    first_shared = bool(agreed) and not joined and all(index[r].get(_key(agreed[0].row)) == 0 for r in waiting)
    next_seq = max(h.next_seq for h in heads)
    if not any(h.stalled for h in heads):
        return Verdict(agreed, {}, joined, None, first_shared, False, next_seq)
    matched = {a.mine for a in agreed}
    names = {d.key(): d.name for d in descriptors if d.name}
    waits = _waits(tables, index, waiting, names)
    abandoned = {}
    for i, d in enumerate(descriptors):
        if i not in matched:
            lacking = [str(r) for r in waiting if d.key() not in index[r]]
            abandoned[i] = (f"{d.what() if d.name else _unnamed(d.kind, d.seq)} was given up: "
                            f"rank{'s' if len(lacking) > 1 else ''} {', '.join(lacking)} did not issue it within the "
                            "collective timeout (--collective-timeout). Ranks may issue named operations in any "
                            f"order, but every rank must issue each one. {waits}")
    return Verdict(agreed, abandoned, joined, None, first_shared, True, next_seq)


def _inline_offsets(table: list[list[int]]) -> list[int | None]:
    """Where each row's inline bytes begin in its rank's area (None from a row claiming too many)."""
    offsets: list[int | None] = []
    used: int | None = 0
    for row in table:
        offsets.append(used)
        n = row[_AT["inline"]]
        if used is not None and n > 0:
            used = used + n if used + n <= INLINE_AREA_BYTES else None
    return offsets


def _waits(tables: list[list[list[int]]], index: list[dict[tuple[int, int], int]], waiting: list[int],
           names: dict[tuple[int, int], str]) -> str:
    """What each waiting rank had queued that another had not: the orders that did not meet."""
    said = []
    for r in waiting:
        lone = [row for row in tables[r] if any(_key(row) not in index[o] for o in waiting)]
        if lone:
            listed = ", ".join(_row_what(row, names) for row in lone[:4]) + (" and more" if len(lone) > 4 else "")
            said.append(f"rank {r} waited with {listed}")
    return ("; ".join(said) + ".") if said else ""


def _refused_while_joined(ours: Sequence[int], joined: list[int], mine: Descriptor | None) -> str:
    what = mine.what() if mine is not None else _what(ours[0], None, ours[_AT["seq"]])
    ranks = f"rank{'s' if len(joined) > 1 else ''} {', '.join(map(str, joined))}"
    if ours[0] not in WHILE_JOINED:
        return (f"{what}: {ranks} joined (hvd.join()) and only allreduces and barriers go on without a rank that "
                "joined, as in Horovod; let every rank join before other collectives")
    if ours[0] == Kind.ALLREDUCE and ours[_AT["op"]] == Reduction.ADASUM:
        return f"{what}: hvd.Adasum cannot go on while {ranks} joined (hvd.join()); use hvd.Average or hvd.Sum"
    if ours[_AT["dtype"]] and dtype_of(ours) is None:
        return f"{what}: its dtype is unknown to {ranks}, which joined (hvd.join())"
    return ""


def announcements(messages: Sequence[torch.Tensor]) -> list[Announcement]:
    """What each rank's message (rank order) says its first operation sent early, checked
    (ValueError naming the rank whose message is impossible)."""
    size = len(messages)
    return [Announcement.from_words(m[_EARLY_AT: _AREA_AT].tolist(), size, rank)
            for rank, m in enumerate(messages)]


def _disagreement(rows: dict[int, list[int]], ours: list[int], mine: Descriptor | None) -> str:
    """Why the ranks' rows for one operation cannot run together ('' if they can)."""
    what = mine.what() if mine is not None else _what(ours[0], None, ours[_AT["seq"]])
    for other, row in rows.items():
        differing = [f for f, a, b in zip(FIELDS, ours, row) if a != b and not _may_differ(f, ours[0])]
        if differing:
            return (f"{what}: rank {other} {_difference(differing[0], row, ours, mine)} (ranks must issue the same "
                    "collectives in the same order, or under the same names)")
    return ""


def _may_differ(field: str, kind: int) -> bool:
    if field == "inline":  # (each rank carries what it can; `decide` looks at all of them)
        return True
    if field in ("dim0", "numel"):
        return kind in FIRST_DIM_FREE
    return False


def _difference(field: str, theirs: list[int], ours: list[int], mine: Descriptor | None) -> str:
    at = _AT[field]
    if field == "kind":
        return f"called {Kind(theirs[at]).name.lower()} there" if theirs[at] in Kind._value2member_map_ \
            else "called another collective there"
    if mine is None:
        return f"gave another {field}"
    if field in ("ndim", "dim0"):
        return f"gave a tensor with {field} {theirs[at]}, this rank {ours[at]} (shape {tuple(mine.tensors[0].shape)})"
    if field in ("shape", "numel"):
        return f"gave tensors of other shapes than this rank's {[tuple(t.shape) for t in mine.tensors]}"
    if field == "dtype":
        return f"gave another dtype than this rank's {mine.tensors[0].dtype}"
    if field == "device":
        return "gave a tensor on another kind of device (CPU against CUDA)"
    if field in ("prescale", "postscale"):
        return f"gave {field}_factor {float_of(theirs[at]):g}, this rank {getattr(mine, field):g}"
    if field == "root":
        return f"gave root_rank {theirs[at]}, this rank {ours[at]}"
    if field == "op":
        return "asked for another reduction op"
    return f"gave another {field}"
