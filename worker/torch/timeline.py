"""Horovod's dynamic timeline: `hvd.start_timeline(path)` ... `hvd.stop_timeline()` records each
collective this worker runs through `ringmaster.torch` in Chrome's trace format (open it in
chrome://tracing or Perfetto): how long it waited in the queue and how long it ran, by name.

Horovod's timeline is written by rank 0; so is this one (the other workers record nothing).
The job-wide timeline of rings, waits and steps is `ringmaster run --timeline`.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import threading

from ringmaster.torch.basics import rank
from ringmaster.worker.train import op_queue
from ringmaster.worker.train.op_queue import Operation

#: Operations recorded per timeline at most (a long run keeps its first ones).
MAX_EVENTS = 1_000_000

_lock = threading.Lock()
_path: pathlib.Path | None = None
_events: list[dict] = []
_marks = False


def _record(operation: Operation) -> None:
    kind = operation.descriptor.kind.name
    name = operation.descriptor.name or kind.lower()
    with _lock:
        if _path is None or len(_events) >= MAX_EVENTS:
            return
        started = operation.started_at or operation.ended_at
        _events.append({"name": "QUEUE", "cat": kind, "ph": "X", "pid": 0, "tid": name,
                        "ts": operation.queued_at * 1e6, "dur": max(0.0, started - operation.queued_at) * 1e6})
        _events.append({"name": kind, "cat": kind, "ph": "X", "pid": 0, "tid": name, "ts": started * 1e6,
                        "dur": max(0.0, operation.ended_at - started) * 1e6,
                        "args": {"error": str(operation.error)} if operation.error is not None else {}})
        if _marks:
            _events.append({"name": "CYCLE_START", "ph": "i", "s": "g", "pid": 0, "tid": name, "ts": started * 1e6})


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording this worker's collectives into `file_path` (rank 0 only, as in Horovod)."""
    global _path, _marks
    path = pathlib.Path(os.fspath(file_path))
    if not path.parent.is_dir():
        raise ValueError(f"start_timeline({file_path!r}): the folder {str(path.parent)!r} does not exist; make it "
                         "first or give a path in an existing folder")
    if rank() != 0:
        return
    with _lock:
        _path, _marks = path, bool(mark_cycles)
        _events.clear()
    if _record not in op_queue.OBSERVERS:
        op_queue.OBSERVERS.append(_record)
        atexit.register(stop_timeline)


def stop_timeline() -> None:
    """Stop recording and write the file (nothing happens when no timeline is being recorded)."""
    global _path
    with _lock:
        path, events = _path, list(_events)
        _path = None
        _events.clear()
    if _record in op_queue.OBSERVERS:
        op_queue.OBSERVERS.remove(_record)
        atexit.unregister(stop_timeline)
    if path is not None:
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
