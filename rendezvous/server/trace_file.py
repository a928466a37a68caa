"""Writing the timeline: a Chrome trace file that stays bounded in size.

The file is a JSON array written as events come (Chrome and Perfetto also open one whose
closing `]` is missing, so a file is useful while the job runs and after a crash). When a file
reaches `max_bytes` it is closed and renamed `FILE.1` (replacing an older one), and a new FILE
begins with the track names again: the timeline never takes more than about twice `max_bytes`
on disk, and FILE always holds the latest part of the job. A FILE already there when the
timeline begins (an earlier run's, or that of a leader that died) becomes `FILE.1` first.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, TextIO

from ringmaster.common.errors import RingmasterError

if TYPE_CHECKING:
    from ringmaster.common.events import Event
    from ringmaster.rendezvous.server.timeline import TraceBuilder

#: Bytes buffered before a write reaches the file (it is also flushed every rendezvous tick).
_BUFFER_BYTES = 1 << 16


class TraceFile:
    """A rotating Chrome trace file. `head()` gives the events every file starts with."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int, head: Callable[[], list[dict[str, Any]]]) -> None:
        self.path = pathlib.Path(path)
        self.max_bytes = max_bytes
        self._head = head
        self.rotations = 0
        self._file: TextIO | None = None
        self._size = 0
        self._empty = True
        self.total_bytes = 0  # written in all, over every rotation
        if not self.path.is_symlink() and self.path.is_file() and self.path.stat().st_size > 0:
            self._keep_previous()  # a timeline left from before (an earlier run, a leader that died) is kept
        self._open()

    def _keep_previous(self) -> None:
        try:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        except OSError as exc:
            raise RingmasterError(f"--timeline {self.path}: cannot keep the file already there as "
                                  f"{self.path.name}.1 ({exc.strerror}); give another file") from None

    def _open(self) -> None:
        try:
            # Never through a symbolic link: one planted at FILE (dangling or not) would have the
            # rendezvous create or overwrite whatever it points at.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            self._file = os.fdopen(fd, "w", encoding="utf-8", buffering=_BUFFER_BYTES)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RingmasterError(f"--timeline {self.path} is a symbolic link; give the file itself") from None
            raise RingmasterError(f"--timeline {self.path}: cannot write the timeline there ({exc.strerror}); "
                                  "give a file in a writable folder") from None
        self._file.write("[\n")
        self._size, self._empty = 2, True
        self._write_all(self._head())

    def write(self, events: Iterable[dict[str, Any]]) -> None:
        """Append events; rotate once the file has reached its bound."""
        if self._file is None:
            return
        self._write_all(events)
        if self._size >= self.max_bytes:
            self._rotate()

    def _write_all(self, events: Iterable[dict[str, Any]]) -> None:
        assert self._file is not None
        for event in events:
            line = ("" if self._empty else ",\n") + json.dumps(event, separators=(",", ":"), default=str)
            self._file.write(line)
            self._size += len(line)
            self.total_bytes += len(line)
            self._empty = False

    def _rotate(self) -> None:
        self._end()
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self.rotations += 1
        self._open()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self, last: Iterable[dict[str, Any]] = ()) -> None:
        """Write the last events and the closing bracket: the file is then plain JSON."""
        if self._file is None:
            return
        self._write_all(last)
        self._end()

    def _end(self) -> None:
        assert self._file is not None
        self._file.write("\n]\n")
        self._file.close()
        self._file = None


class JobTimeline:
    """The timeline of one job: what the rendezvous sees goes through `TraceBuilder` into a
    `TraceFile`. A file that cannot be written any more (a full disk) ends the timeline, said
    once through `on_failed`, never the job."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int, builder: "TraceBuilder",
                 clock_us: Callable[[], int], on_failed: Callable[[str], None],
                 on_written: Callable[[TraceFile], None] = lambda _: None) -> None:
        self.builder = builder
        self._clock_us = clock_us
        self._on_failed = on_failed
        self._on_written = on_written
        self.file: TraceFile | None = TraceFile(path, max_bytes, builder.metadata)

    def on_event(self, event: "Event") -> None:
        if self.file is not None:
            self._guarded(lambda file: file.write(self.builder.on_event(event, self._clock_us())))

    def on_spans(self, worker_id: str, spans: Iterable[Any], dropped: int) -> None:
        if self.file is not None:
            self._guarded(lambda file: file.write(self.builder.on_spans(worker_id, spans, dropped)))

    def flush(self) -> None:
        if self.file is not None:
            self._guarded(lambda file: file.flush())

    def close(self) -> None:
        """The last events and the closing bracket; `on_written` says where it all went."""
        if self.file is None:
            return
        self._guarded(lambda file: file.close(self.builder.close(self._clock_us())))
        if self.file is not None:  # (None: the last write failed, and that was said)
            self._on_written(self.file)
            self.file = None

    def _guarded(self, action: Callable[[TraceFile], None]) -> None:
        assert self.file is not None
        try:
            action(self.file)
        except (OSError, RingmasterError) as exc:
            path, self.file = self.file.path, None
            self._on_failed(f"{path}: {getattr(exc, 'strerror', None) or exc}")
