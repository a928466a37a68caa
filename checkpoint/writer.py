"""Durable checkpoints written off the training thread.

The training thread hands over a commit by copying it into a staging snapshot (host to host,
buffers reused: the cost of one in-memory commit) and goes on; a writer thread serialises,
checksums and fsyncs it. While a write is in flight, the next due checkpoint is skipped, never
waited for, so a slow disk never stalls a step. A failed write (disk full, read-only) is
reported; the checkpoints already on disk stay as they were.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ringmaster.checkpoint.directory import CheckpointDirectory
from ringmaster.checkpoint.memory import HostSnapshot


class BackgroundWriter:
    def __init__(self, directory: CheckpointDirectory, report: Callable[[str], None],
                 report_written: Callable[[str], None] | None = None) -> None:
        """`report` hears of writes that failed; `report_written` (default: `report`) of the first
        write that succeeded, and of the first after failures."""
        self.directory = directory
        self._report = report
        self._report_written = report_written or report
        self._staging = HostSnapshot()
        self._cond = threading.Condition()
        self._job: tuple[int, int, int, float] | None = None  # step, world size, generation, created
        self._busy = False
        self._thread: threading.Thread | None = None
        self._failing = ""  # the reason of the last failed write; "" after a success
        #: Steps written, oldest first (this process only).
        self.written: list[int] = []
        self.failures = 0
        self.bytes_written = 0  # tensor bytes of the checkpoints written

    def figures(self) -> tuple[int, int, int]:
        """(checkpoints written, writes failed, bytes written) so far, for the worker's figures."""
        return len(self.written), self.failures, self.bytes_written

    def submit(self, snapshot: HostSnapshot, step: int, world_size: int, generation: int) -> bool:
        """Stage `snapshot` for writing as `step`. False (nothing staged) while a write is in flight."""
        with self._cond:
            if self._busy:
                return False
            self._busy = True
        self._staging.copy_from(snapshot)
        with self._cond:
            self._job = (step, world_size, generation, time.time())
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ringmaster-checkpoint-writer", daemon=True)
            self._thread.start()
        return True

    @property
    def last_failure(self) -> str:
        """Why the last write failed ("" if it succeeded)."""
        return self._failing

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._busy

    def flush(self, timeout_s: float) -> bool:
        """Wait for the write in flight, if any. False if it is still going at the deadline."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy, timeout_s)

    def _run(self) -> None:
        try:
            self.directory.remove_unfinished()
        except OSError:
            pass  # a read-only folder: the write below reports it
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None)
                assert self._job is not None
                step, world_size, generation, created = self._job
                self._job = None
            started = time.perf_counter()
            try:
                folder = self.directory.write(self._staging.export(), step, world_size, generation, created)
            except Exception as exc:
                self.failures += 1
                reason = _describe(exc)
                if reason != self._failing:  # once per cause, not at every due checkpoint
                    newest = self.written[-1] if self.written else None
                    kept = (
                        f"the newest checkpoint written is step {newest}"
                        if newest is not None
                        else "no checkpoint was written yet"
                    )
                    self._report(
                        f"could not write the checkpoint of step {step} to {self.directory.path}: {reason}; "
                        f"training goes on with in-memory commits and {kept}"
                    )
                self._failing = reason
            else:
                if not self.written or self._failing:
                    self._report_written(
                        f"checkpoint of step {step} written to {folder} "
                        f"({self._staging.nbytes / 1e6:.1f} MB of tensors in {time.perf_counter() - started:.2f} s)"
                    )
                self._failing = ""
                self.written.append(step)
                self.bytes_written += self._staging.nbytes
            with self._cond:
                self._busy = False
                self._cond.notify_all()


def _describe(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}"
