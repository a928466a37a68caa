"""A finished (or running) job read back from its log: what `ringmaster plot` draws and what
`ringmaster demo` reports.

A job's log is what `ringmaster run --log-format json` prints (one JSON event per line, and the
workers' lines as `[worker id] text`) or what `ringmaster events --json` prints (each event's
fields under "fields"). Training figures come from the workers' lines whose text is a JSON
object with a numeric `step` and a `loss` or an `accuracy` (as `examples/digits.py` prints them
on rank 0). Anything else is skipped: a log is input, and one bad line costs only that line.

Pure: lines in, records out.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

#: Longest line read (longer ones are skipped: no event or figure line is anywhere near it).
MAX_LINE_CHARS = 65_536
#: Most lines read from one log (a log past it is read up to it).
MAX_LINES = 2_000_000

_WORKER_LINE = re.compile(r"^\[([A-Za-z0-9_.:\-]{1,300}/\d{1,12})\] (.*)$")
#: Events that take workers away without warning: each is a fault that the job recovers from.
FAULT_KINDS = ("host.lost", "worker.failed")


@dataclass(frozen=True)
class Generation:
    number: int
    started: float  # seconds since the log's first record
    size: int
    cause: str  # in words
    causes: tuple[str, ...]  # `ResetCause` values; empty for the first generation


@dataclass(frozen=True)
class Point:
    """One figure line of rank 0: the step, and the loss or the test accuracy at it."""

    at: float
    step: int
    loss: float | None = None
    accuracy: float | None = None
    size: int | None = None


@dataclass(frozen=True)
class Disruption:
    """Something that changed the ring: a fault, a host added or a scale, and what it cost."""

    at: float
    kind: str  # the event's kind (host.lost, worker.failed, scale.requested, hosts.changed, host.drained, ...)
    what: str  # its message
    recovered_s: float | None = None  # a fault: from when it was seen to rank 0's first commit after it
    pause_s: float | None = None  # the longest gap between two steps from it until the ring it caused trained
    steps_redone: int = 0  # steps trained again after it (rolled back)


@dataclass
class JobHistory:
    t0: float = 0.0  # wall-clock time of the first record (seconds since the epoch)
    events: list[dict[str, Any]] = field(default_factory=list)  # with "at": seconds since t0
    points: list[Point] = field(default_factory=list)
    # When the script said it waits on purpose (a `waiting` record: `examples/digits.py` holds
    # before its last epoch until `ringmaster demo` has done its acts): no step is lost to a change then.
    waits: list[float] = field(default_factory=list)
    skipped: int = 0  # lines that were neither an event nor a figure nor plain worker output

    def of_kind(self, *kinds: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") in kinds]

    @property
    def generations(self) -> list[Generation]:
        out = []
        for e in self.of_kind("generation.formed"):
            causes = e.get("causes")
            out.append(Generation(_int(e.get("number")), e["at"], _int(e.get("size")), str(e.get("cause", ""))[:200],
                                  tuple(str(c)[:40] for c in causes) if isinstance(causes, list) else ()))
        return out

    @property
    def end(self) -> float:
        times = [e["at"] for e in self.events] + [p.at for p in self.points]
        return max(times, default=0.0)

    def final_accuracy(self) -> float | None:
        accuracies = [p.accuracy for p in self.points if p.accuracy is not None]
        return accuracies[-1] if accuracies else None

    def disruptions(self, kinds: Iterable[str] = (*FAULT_KINDS, "scale.requested", "hosts.changed",
                                                   "host.draining")) -> list[Disruption]:
        """Each ring-changing event with its cost. Failures of several workers of one host at
        once are one fault (the host's loss): a fault within a second of the last is folded in."""
        chosen = [e for e in self.of_kind(*kinds)]
        merged: list[dict[str, Any]] = []
        for e in chosen:
            if (merged and e["kind"] in FAULT_KINDS and merged[-1]["kind"] in FAULT_KINDS
                    and e["at"] - merged[-1]["at"] < 1.0):
                if e["kind"] == "host.lost" and merged[-1]["kind"] != "host.lost":  # (the host's loss names it best)
                    merged[-1] = {**e, "at": merged[-1]["at"]}
                continue
            merged.append(e)
        recoveries = self.of_kind("job.recovered")
        formed = self.generations
        counted: set[int] = set()  # steps trained again, each put down to one change (a fault first)
        out = []
        for i, e in enumerate(merged):
            at = e["at"]
            until = merged[i + 1]["at"] if i + 1 < len(merged) else math.inf
            # (a recovery follows a fault, however soon another change comes: up to the next fault)
            next_fault = next((m["at"] for m in merged[i + 1:] if m["kind"] in FAULT_KINDS), math.inf)
            recovered = next((_float(r.get("seconds")) for r in recoveries if at <= r["at"] < next_fault), None) \
                if e["kind"] in FAULT_KINDS else None
            next_gen = next((g for g in formed if at <= g.started < until), None)  # (the ring it caused)
            out.append(Disruption(at, e["kind"], str(e.get("message", e["kind"]))[:300], recovered,
                                  self._pause(at, next_gen),
                                  self._redone(at, next_fault if e["kind"] in FAULT_KINDS else until, counted)))
        return out

    def _steps(self) -> list[Point]:
        return [p for p in self.points if p.loss is not None]

    def loss_by_step(self) -> dict[int, float]:
        """The loss rank 0 said for each step, the last time it said it (a step trained again
        after a rollback replaces the one rolled back)."""
        return {p.step: p.loss for p in self._steps() if p.loss is not None}

    def largest_loss_difference(self, other: "JobHistory") -> tuple[float, int, int] | None:
        """The largest relative difference between this job's loss and `other`'s at a step both
        trained, the first step where it is that large, and how many steps both trained; None
        when they share no step."""
        mine, theirs = self.loss_by_step(), other.loss_by_step()
        shared = sorted(s for s in mine if s in theirs)
        if not shared:
            return None
        worst = max(abs(mine[s] - theirs[s]) / max(abs(theirs[s]), 1e-12) for s in shared)
        first = next(s for s in shared if abs(mine[s] - theirs[s]) / max(abs(theirs[s]), 1e-12) == worst)
        return worst, first, len(shared)

    def _pause(self, at: float, gen: Generation | None) -> float | None:
        """The longest gap between consecutive steps from the last one before `at` to the first
        one trained in `gen` (None when that ring never trained)."""
        steps = self._steps()
        if gen is None:
            return None
        before = [p.at for p in steps if p.at <= at]
        after = [p for p in steps if p.at >= gen.started]
        if not after:
            return None
        times = ([before[-1]] if before else []) + [p.at for p in steps if at < p.at <= after[0].at]
        gaps = [(a, b) for a, b in zip(times, times[1:])]
        # (a gap in which the script waited on purpose is its own choice, not what the change cost)
        paused = [b - a for a, b in gaps if not self._waited_within(a, b)]
        return max(paused) if paused else (None if gaps else 0.0)

    def _waited_within(self, a: float, b: float) -> bool:
        """Whether the script said it waits at a time in [a, b]. (`waits` is in time order: a
        search, not a scan, so that a log of a million waits and steps stays linear in its length.)"""
        i = bisect.bisect_left(self.waits, a)
        return i < len(self.waits) and self.waits[i] <= b

    def _redone(self, at: float, until: float, counted: set[int]) -> int:
        """Steps trained between `at` and `until` that had been trained before `at` (and not
        put down to an earlier change: a fault's rollback is seen after the changes that follow
        it within moments, such as its host leaving the discovery script)."""
        steps = self._steps()
        done = max((p.step for p in steps if p.at <= at), default=0)
        again = {p.step for p in steps if at < p.at < until and p.step <= done} - counted
        counted.update(again)
        return len(again)


def read_history(lines: Iterable[str]) -> JobHistory:
    history = JobHistory()
    records: list[tuple[float, dict[str, Any] | Point]] = []
    for count, line in enumerate(lines):
        if count >= MAX_LINES:
            break
        if len(line) > MAX_LINE_CHARS:
            history.skipped += 1
            continue
        line = line.rstrip("\n")
        worker = _WORKER_LINE.match(line)
        if worker:
            point = _point(worker.group(2))
            if point is not None:
                records.append((point.at, point))
            elif (waited := _waiting(worker.group(2))) is not None:
                records.append((waited, {"waiting": True}))
            continue
        event = _event(line)
        if event is None:
            if line.strip():
                history.skipped += 1
            continue
        records.append((event["time"], event))
    if not records:
        return history
    history.t0 = min(t for t, _ in records)
    for t, record in sorted(records, key=lambda r: r[0]):
        if isinstance(record, Point):
            history.points.append(Point(t - history.t0, record.step, record.loss, record.accuracy, record.size))
        elif "kind" not in record:  # (a `waiting` record: events have a kind)
            history.waits.append(t - history.t0)
        else:
            history.events.append({**record, "at": t - history.t0})
    return history


def _event(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str) or not _finite(record.get("time")):
        return None
    fields = record.get("fields")
    if isinstance(fields, dict):  # `ringmaster events --json`: the fields apart
        record = {**fields, **{k: v for k, v in record.items() if k != "fields"}}
    return record


def _point(text: str) -> Point | None:
    if not text.startswith("{"):
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or not _finite(record.get("time")) or not isinstance(record.get("step"), int):
        return None
    loss, acc = record.get("loss"), record.get("accuracy")
    if record.get("done") or not (_finite(loss) or _finite(acc)):
        return None
    size = record.get("size")
    return Point(float(record["time"]), record["step"], _float(loss), _float(acc),
                 size if isinstance(size, int) else None)


def _waiting(text: str) -> float | None:
    """The time of a record saying the script waits on purpose (`{"waiting": true, "time": ...}`)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if isinstance(record, dict) and record.get("waiting") is True and _finite(record.get("time")):
        return float(record["time"])
    return None


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: object) -> float | None:
    return float(value) if _finite(value) else None  # type: ignore[arg-type]


def describe_difference(difference: tuple[float, int, int] | None) -> str:
    """How two runs' losses compare, in words (`JobHistory.largest_loss_difference`)."""
    if difference is None:
        return "no step in common"
    worst, step, steps = difference
    if worst == 0.0:
        return f"the same loss at all {steps} steps"
    return f"largest relative difference {worst:.1e} (step {step} of {steps})"
