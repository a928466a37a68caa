"""Keep the control API from eating the rendezvous' file descriptors.

The rendezvous process also hosts the gRPC service and the TCPStore the workers' rings meet
on; a neighbour that opens a thousand HTTP connections and sends nothing must not starve them.
So the control API's HTTP protocol (uvicorn's h11 one) is wrapped:

- at most `MAX_CONNECTIONS` connections are kept; one more is closed as soon as it is accepted
  (its descriptor is released at once), and the listening backlog is as small, so the event
  loop never accepts more than that many at once;
- a connection that has not started a request within `REQUEST_START_TIMEOUT_S` is closed
  (slow or stalled clients hold nothing for long).

`raise_open_file_limit` lifts the process' soft descriptor limit to its hard limit at start,
and `quiet_repeats` keeps a burst of identical event-loop errors (EMFILE on accept) to one
log line per interval with a count.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any, Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

from ringmaster.common import logs
from ringmaster.common.events import Event, Kind, log_event

#: Most simultaneous control-API connections (an operator's tools need a handful).
MAX_CONNECTIONS = 64
#: Seconds a connection may stay open without starting a request.
REQUEST_START_TIMEOUT_S = 10.0
#: Seconds between two log lines about the same event-loop error.
REPEAT_INTERVAL_S = 10.0


class GuardedH11Protocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            return
        self._start_timer = self.loop.call_later(REQUEST_START_TIMEOUT_S, self._close_if_idle)

    def _close_if_idle(self) -> None:
        if self.cycle is None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_start_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)


def raise_open_file_limit() -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


def quiet_repeats(say: Callable[[Event], None] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> Callable[[Any, dict], None]:
    """An event-loop exception handler that logs each kind of error at most once per
    REPEAT_INTERVAL_S, saying how many were left out. `say` hears the events (default: the
    rendezvous logger)."""
    if say is None:
        logger = logging.getLogger(logs.RENDEZVOUS)

        def say(event: Event) -> None:
            log_event(logger, event)

    last: dict[str, float] = {}
    skipped: dict[str, int] = {}

    def handler(loop: Any, context: dict) -> None:
        exc = context.get("exception")
        kind = f"{context.get('message', '')}: {type(exc).__name__}: {exc}" if exc else str(context.get("message", ""))
        now = clock()
        if now - last.get(kind, -REPEAT_INTERVAL_S) < REPEAT_INTERVAL_S:
            skipped[kind] = skipped.get(kind, 0) + 1
            return
        more = skipped.pop(kind, 0)
        last[kind] = now
        say(Event(Kind.EVENT_LOOP_ERROR, {"error": kind[:300], "repeats": (more, REPEAT_INTERVAL_S)}))

    return handler
