"""`ringmaster run`'s progress: a live status line on a terminal, a plain `job.progress` event
every so often otherwise (logs, CI, files).

The line says the generation, world size, committed steps, steps/s and the time since the last
reset. On a terminal it is redrawn in place; the job's own log lines clear it before they are
written (a logging filter), and so do the lines of the agents and their workers, which `run`
relays (`common/console`), so the status never mixes with any other output.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, TextIO

from ringmaster.common import console, logs
from ringmaster.common.events import Event, Kind, log_event
from ringmaster.rendezvous.control.view import NO_ROWS

if TYPE_CHECKING:  # (the server's modules are heavy: torch, grpc)
    from ringmaster.rendezvous.server.app import RendezvousServer

#: Seconds between two redraws of the status line on a terminal.
TTY_EVERY_S = 0.5
#: Seconds between two `job.progress` events when the output is not a terminal.
PLAIN_EVERY_S = 30.0
_CLEAR = "\r\x1b[K"


def progress_fields(server: RendezvousServer) -> dict[str, object] | None:
    """The status line's figures, or None before the job runs and has a generation."""
    view, metrics = server.view(NO_ROWS), server.metrics
    if view is None or not view.generation or metrics is None:
        return None
    return {"number": view.generation, "size": view.world_size, "steps": view.steps,
            "rate": round(metrics.steps_per_second(), 2),
            "since_reset_s": round(view.time - view.generation_formed_at, 1)}


def status_text(fields: dict[str, object]) -> str:
    return Event(Kind.JOB_PROGRESS, fields).message


class ProgressLine:
    def __init__(self, stream: TextIO, tty: bool, clock: Callable[[], float], every_s: float | None = None) -> None:
        self.stream = stream
        self.tty = tty
        self.clock = clock
        self.every_s = every_s if every_s is not None else (TTY_EVERY_S if tty else PLAIN_EVERY_S)
        self._shown = False
        self._filter: logging.Filter | None = None
        self._remove_hook: Callable[[], None] | None = None

    async def run(self, server: RendezvousServer) -> None:
        """Show progress until cancelled (when the job ends)."""
        if self.tty:
            self._clear_before_logs()
            self._remove_hook = console.before_output(self.clear)
        try:
            while True:
                await asyncio.sleep(self.every_s)
                fields = progress_fields(server)
                if fields is None:
                    continue
                if self.tty:
                    with console.lock:
                        self.stream.write(_CLEAR + status_text(fields))
                        self.stream.flush()
                        self._shown = True
                else:
                    log_event(logging.getLogger(logs.CLI), Event(Kind.JOB_PROGRESS, fields))
        finally:
            self.clear()
            if self._remove_hook is not None:
                self._remove_hook()
            if self._filter is not None:
                for handler in logging.getLogger(logs.ROOT).handlers:
                    handler.removeFilter(self._filter)

    def clear(self) -> None:
        with console.lock:
            if self._shown:
                self.stream.write(_CLEAR)
                self.stream.flush()
                self._shown = False

    def _clear_before_logs(self) -> None:
        line = self

        class _ClearFirst(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                line.clear()
                return True

        self._filter = _ClearFirst()
        for handler in logging.getLogger(logs.ROOT).handlers:
            handler.addFilter(self._filter)
