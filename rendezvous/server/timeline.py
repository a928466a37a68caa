"""The job's timeline (`--timeline FILE`) as Chrome trace events (chrome://tracing, Perfetto).

Two processes in the trace:
- "rendezvous" (pid 0): a "generations" track (one slice per generation, from its formation
  to the next, with its causes), a "hosts" track (hosts added, lost, left, blacklisted; scale
  requests) and a "failures" track (one slice per failed worker).
- "ranks" (pid 1): one track per rank with the workers' spans (forward, backward, allreduce per
  bucket, optimizer step, commit, restore, sync, ring build, waiting), as their heartbeats
  bring them.
Flow arrows go from the failure that ended a generation to each surviving worker's first step
of recovery (its restore, or its wait for the next generation).

`TraceBuilder` is pure: events and spans in, trace events (dicts) out; `trace_file` writes them.
Rendezvous events are timed by the wall clock when they are told (`at_us`); workers' spans by
their own wall clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ringmaster.common.events import Event, Kind
from ringmaster.common.spans import SPAN_NAMES, STEP_KINDS, check_span
from ringmaster.proto import ringmaster_pb2 as pb

RENDEZVOUS_PID, RANKS_PID = 0, 1
GENERATIONS_TID, HOSTS_TID, FAILURES_TID = 0, 1, 2
#: Length of a failure's slice (µs): long enough to see and to anchor its arrows.
FAILURE_SLICE_US = 1000
#: The worker spans a failure's arrow may end on: the first of them after the failure.
RECOVERY_KINDS = frozenset({pb.SPAN_RESTORE, pb.SPAN_WAITING, pb.SPAN_RING_BUILD})
_HOST_KINDS = {Kind.HOSTS_CHANGED, Kind.HOST_LOST, Kind.HOST_LEFT, Kind.HOST_BLACKLISTED, Kind.HOST_UNREACHABLE,
               Kind.AGENT_CONNECTED, Kind.SCALE_REQUESTED}
_FAILURE_KINDS = {Kind.WORKER_FAILED}
_JOB_END_KINDS = {Kind.JOB_SUCCEEDED, Kind.JOB_FAILED}


@dataclass
class _Flow:
    flow_id: int
    at_us: int


@dataclass
class TraceBuilder:
    """Turns what the rendezvous sees into trace events. `members()` gives the current
    generation's (worker id, host) pairs, for the arrows of a failure."""

    members: Callable[[], list[tuple[str, str]]]
    _generation: tuple[int, int, dict[str, Any]] | None = None  # (number, start µs, args) of the open one
    _ranks: set[int] = field(default_factory=set)
    _flows: dict[str, _Flow] = field(default_factory=dict)  # worker id -> arrow waiting for its recovery
    _flowed_generation: int | None = None
    _next_flow: int = 1
    _dropped: dict[str, int] = field(default_factory=dict)
    _lost_hosts: set[str] = field(default_factory=set)  # since the last generation formed: no arrows there
    _draining: dict[str, int] = field(default_factory=dict)  # host -> when its drain began (µs)

    def metadata(self) -> list[dict[str, Any]]:
        """Names of the processes and tracks (at the head of every file)."""
        out = [_meta("process_name", RENDEZVOUS_PID, 0, "rendezvous"), _meta("process_name", RANKS_PID, 0, "ranks"),
               _meta("process_sort_index", RENDEZVOUS_PID, 0, sort_index=0),
               _meta("process_sort_index", RANKS_PID, 0, sort_index=1)]
        for tid, name in ((GENERATIONS_TID, "generations"), (HOSTS_TID, "hosts"), (FAILURES_TID, "failures")):
            out.append(_meta("thread_name", RENDEZVOUS_PID, tid, name))
        out += [_meta("thread_name", RANKS_PID, rank, f"rank {rank}") for rank in sorted(self._ranks)]
        return out

    # ------------------------------------------------------------ the rendezvous' events
    def on_event(self, event: Event, at_us: int) -> list[dict[str, Any]]:
        kind, fields = event.kind, event.fields
        if kind is Kind.GENERATION_FORMED:
            out = self._close_generation(at_us)
            self._lost_hosts.clear()
            number = int(fields.get("number", 0))
            self._generation = (number, at_us, {"size": fields.get("size"), "hosts": fields.get("hosts"),
                                                "cause": fields.get("cause"), "causes": list(fields.get("causes", ()))})
            return out
        if kind in _JOB_END_KINDS:
            return [*self._close_generation(at_us),
                    _instant(kind.value, RENDEZVOUS_PID, GENERATIONS_TID, at_us, {"reason": fields.get("reason")})]
        if kind in (Kind.GENERATION_OVER, Kind.JOB_RECOVERED):
            return [_instant(kind.value, RENDEZVOUS_PID, GENERATIONS_TID, at_us, dict(fields))]
        if kind is Kind.HOST_DRAINING:
            host = str(fields.get("host", ""))
            self._draining.setdefault(host, at_us)
            return [_instant(_host_label(event), RENDEZVOUS_PID, HOSTS_TID, at_us, dict(fields))]
        if kind is Kind.HOST_DRAINED:  # the drain as a span: from the request to its workers gone
            start = self._draining.pop(str(fields.get("host", "")), at_us)
            return [{"name": f"{fields.get('host', '?')}: drain ({fields.get('outcome')})", "cat": "rendezvous",
                     "ph": "X", "ts": start, "dur": max(1, at_us - start), "pid": RENDEZVOUS_PID, "tid": HOSTS_TID,
                     "args": dict(fields)}]
        if kind is Kind.HOST_UNDRAINED:
            self._draining.pop(str(fields.get("host", "")), None)
            return [_instant(_host_label(event), RENDEZVOUS_PID, HOSTS_TID, at_us, dict(fields))]
        if kind in _HOST_KINDS:
            if kind is Kind.HOST_LOST:
                self._lost_hosts.add(str(fields.get("host", "")))
            return [_instant(_host_label(event), RENDEZVOUS_PID, HOSTS_TID, at_us, dict(fields))]
        if kind in _FAILURE_KINDS:
            return self._failure(event, at_us)
        return []

    def _close_generation(self, at_us: int) -> list[dict[str, Any]]:
        if self._generation is None:
            return []
        number, start, args = self._generation
        self._generation = None
        return [{"name": f"generation {number}", "cat": "rendezvous", "ph": "X",
                 "ts": start, "dur": max(1, at_us - start),
                 "pid": RENDEZVOUS_PID, "tid": GENERATIONS_TID, "args": args}]

    def _failure(self, event: Event, at_us: int) -> list[dict[str, Any]]:
        worker = str(event.fields.get("worker", "?"))
        out = [{"name": f"{worker} failed", "cat": "failure", "ph": "X", "ts": at_us, "dur": FAILURE_SLICE_US,
                "pid": RENDEZVOUS_PID, "tid": FAILURES_TID, "args": dict(event.fields)}]
        # The first failure of a generation ends it: arrows to each survivor's recovery. Others
        # in the same generation (the rest of a lost host's workers) only get their slice. An
        # arrow is written whole when its worker's recovery span arrives (`on_spans`): a worker
        # that turns out not to survive (its host's loss is often seen a moment after its
        # host-mate's failure) leaves no arrow pointing nowhere.
        generation = event.generation
        if generation is not None and generation == self._flowed_generation:
            return out
        self._flowed_generation = generation
        for worker_id, host in self.members():
            if worker_id == worker or host in self._lost_hosts:
                continue
            self._flows[worker_id] = _Flow(self._next_flow, at_us)
            self._next_flow += 1
        return out

    # ------------------------------------------------------------ the workers' spans
    def on_spans(self, worker_id: str, spans: Iterable[pb.Span], dropped: int = 0) -> list[dict[str, Any]]:
        """A heartbeat's spans (those that could not come from a worker are left out)."""
        out: list[dict[str, Any]] = []
        for span in spans:
            if check_span(span):
                continue
            rank = span.rank
            if rank not in self._ranks:
                self._ranks.add(rank)
                out.append(_meta("thread_name", RANKS_PID, rank, f"rank {rank}"))
            step = span.kind in STEP_KINDS
            record: dict[str, Any] = {"name": SPAN_NAMES[span.kind], "cat": "step" if step else "elastic", "ph": "X",
                                      "ts": span.start_us, "dur": span.duration_us, "pid": RANKS_PID, "tid": rank}
            if span.kind == pb.SPAN_ALLREDUCE:
                record["args"] = {"bucket": span.detail}
            elif not step:
                record["args"] = {"worker": worker_id, "generation": span.generation}
            out.append(record)
            flow = self._flows.get(worker_id)
            if flow is not None and span.kind in RECOVERY_KINDS and span.start_us + span.duration_us >= flow.at_us:
                del self._flows[worker_id]
                at = min(max(span.start_us, flow.at_us), span.start_us + span.duration_us)
                out.append({"name": "recovery", "cat": "recovery", "ph": "s", "id": flow.flow_id, "ts": flow.at_us,
                            "pid": RENDEZVOUS_PID, "tid": FAILURES_TID})
                out.append({"name": "recovery", "cat": "recovery", "ph": "f", "bp": "e", "id": flow.flow_id, "ts": at,
                            "pid": RANKS_PID, "tid": rank})
        if dropped > self._dropped.get(worker_id, 0) and out:
            newly = dropped - self._dropped.get(worker_id, 0)
            self._dropped[worker_id] = dropped
            last = out[-1]
            out.append(_instant(f"{newly} spans dropped", RANKS_PID, last["tid"], last["ts"], {"worker": worker_id}))
        return out

    def close(self, at_us: int) -> list[dict[str, Any]]:
        """The end of the trace: the open generation's slice."""
        return self._close_generation(at_us)


def _meta(name: str, pid: int, tid: int, label: str | None = None, sort_index: int | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"name": label} if label is not None else {"sort_index": sort_index}
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _instant(name: str, pid: int, tid: int, at_us: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "cat": "rendezvous", "ph": "i", "s": "t", "ts": at_us, "pid": pid, "tid": tid, "args": args}


def _host_label(event: Event) -> str:
    fields = event.fields
    if event.kind is Kind.HOSTS_CHANGED:
        return f"hosts: {fields.get('description', '')}"
    if event.kind is Kind.SCALE_REQUESTED:
        return f"scale to {fields.get('np')}"
    return f"{fields.get('host', '?')}: {event.kind.value.split('.', 1)[1].replace('_', ' ')}"
