"""Timeline spans: what workers record with `--timeline` and the rendezvous writes down.

Worker side: `SpanRecorder` keeps spans (kind, start, duration, rank, generation, detail) in a
bounded buffer; the heartbeat thread takes at most MAX_SPANS_PER_HEARTBEAT of them per beat and
gives them back if the beat did not get through. A full buffer drops the newest spans and counts
them, so a stalled rendezvous costs the worker neither memory nor time. A recorder that is off
(the default) records nothing and costs one attribute test per call site.

Rendezvous side: `check_span` refuses what no worker of this job would send.
"""

from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Iterator

from ringmaster.proto import environment as env_names
from ringmaster.proto import ringmaster_pb2 as pb

#: Most spans one heartbeat carries (about 40 bytes each on the wire, far below the 1 MiB limit).
MAX_SPANS_PER_HEARTBEAT = 8192
#: Most spans a worker keeps while its heartbeats cannot take them; more are dropped and counted.
MAX_BUFFERED_SPANS = 65536
#: Environment variable that turns the recorder on in a worker ("1"; the rendezvous sets it
#: for every worker when the job has a timeline).
TIMELINE_SPANS_ENV = env_names.TIMELINE_SPANS
#: A span longer than this (one day) is not one any worker measured.
MAX_SPAN_US = 86_400 * 1_000_000
#: The names spans have in the trace.
SPAN_NAMES: dict[int, str] = {
    pb.SPAN_FORWARD: "forward",
    pb.SPAN_BACKWARD: "backward",
    pb.SPAN_ALLREDUCE: "allreduce",
    pb.SPAN_OPTIMIZER_STEP: "optimizer step",
    pb.SPAN_COMMIT: "commit",
    pb.SPAN_RESTORE: "restore",
    pb.SPAN_SYNC: "sync",
    pb.SPAN_RING_BUILD: "ring build",
    pb.SPAN_WAITING: "waiting",
}
#: Spans of the training step (category "step"); the others are the elastic machinery ("elastic").
STEP_KINDS = frozenset({pb.SPAN_FORWARD, pb.SPAN_BACKWARD, pb.SPAN_ALLREDUCE, pb.SPAN_OPTIMIZER_STEP})
#: Largest rank a span may name (a bound, far above any job's size).
MAX_RANK = 1 << 20


def now_us() -> int:
    """The wall clock in microseconds: the clock spans are told in (hosts keep it by NTP)."""
    return time.time_ns() // 1000


Record = tuple[int, int, int, int, int, int]  # kind, start_us, duration_us, rank, generation, detail
_NOTHING: AbstractContextManager[None] = nullcontext()


class SpanRecorder:
    """A worker's spans since its last heartbeat. Written by the training thread (and Gloo's
    completion callbacks), taken by the heartbeat thread."""

    def __init__(self, on: bool = False, capacity: int = MAX_BUFFERED_SPANS) -> None:
        self.on = on
        self.capacity = capacity
        self.dropped = 0
        self._spans: list[Record] = []
        self._lock = threading.Lock()
        #: (rank, generation) that spans are told under; the worker's context keeps it current.
        self.place = (0, 0)

    def add(self, kind: int, start_us: int, end_us: int, detail: int = 0) -> None:
        """Record a span (nothing when off)."""
        if not self.on:
            return
        rank, generation = self.place
        record = (kind, start_us, max(0, end_us - start_us), rank, generation, detail)
        with self._lock:
            if len(self._spans) >= self.capacity:
                self.dropped += 1
                return
            self._spans.append(record)

    def span(self, kind: int, detail: int = 0) -> AbstractContextManager[None]:
        """Record the enclosed block as a span of `kind` (also when it raises); nothing when off."""
        return self._span(kind, detail) if self.on else _NOTHING

    @contextmanager
    def _span(self, kind: int, detail: int) -> Iterator[None]:
        start = now_us()
        try:
            yield
        finally:
            self.add(kind, start, now_us(), detail)

    def pending(self) -> int:
        with self._lock:
            return len(self._spans)

    def take(self, limit: int = MAX_SPANS_PER_HEARTBEAT) -> list[Record]:
        """The oldest spans, at most `limit`, removed from the buffer."""
        with self._lock:
            taken, self._spans = self._spans[:limit], self._spans[limit:]
        return taken

    def give_back(self, taken: list[Record]) -> None:
        """Spans whose heartbeat did not get through go back in front (what no longer fits is
        dropped and counted)."""
        with self._lock:
            room = max(0, self.capacity - len(self._spans))
            self.dropped += max(0, len(taken) - room)
            self._spans = taken[:room] + self._spans

    @staticmethod
    def proto(taken: list[Record]) -> list[pb.Span]:
        return [pb.Span(kind=pb.SpanKind.ValueType(k), start_us=s, duration_us=d, rank=r, generation=g, detail=x)
                for k, s, d, r, g, x in taken]


def check_span(span: pb.Span) -> str:
    """"" when `span` could come from a worker of this job; otherwise what is wrong with it."""
    if span.kind not in SPAN_NAMES:
        return f"unknown span kind {span.kind}"
    if not 0 < span.start_us < (1 << 53):
        return f"start {span.start_us} µs is out of range"
    if not 0 <= span.duration_us <= MAX_SPAN_US:
        return f"duration {span.duration_us} µs is out of range"
    if not 0 <= span.rank <= MAX_RANK:
        return f"rank {span.rank} is out of range"
    if not 0 <= span.generation < (1 << 53) or not 0 <= span.detail < (1 << 31):
        return "generation or detail out of range"
    return ""
