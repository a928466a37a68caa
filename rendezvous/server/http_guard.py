"""Keep the control API from eating the rendezvous' file descriptors.

The rendezvous process also hosts the gRPC service and the TCPStore the workers' rings meet
on; a neighbour that opens a thousand HTTP connections and sends nothing must not starve them.
So the control API's HTTP protocol (uvicorn's h11 one) is wrapped:

- at most `max_connections(open files)` connections are kept (from 64 with a limit of 1024
  descriptors up to `MAX_CONNECTIONS`); one more is closed as soon as it is accepted
  (its descriptor is released at once), and the listening backlog is as small, so the event
  loop never accepts more than that many at once;
- while more than `MAX_WAITING` of them wait without a request in progress (new, or idle
  between requests), those that have waited `PRESSED_WAIT_S` are closed, oldest first, until
  `MAX_WAITING` are left: a client that sends its request as it connects (an operator's
  `ringmaster status`, the `/healthz` probe, the dashboard) is served, however many stalled
  connections a neighbour keeps opening;
- a connection that has not started a request within `REQUEST_START_TIMEOUT_S`, or whose request
  is not answered within `REQUEST_TIMEOUT_S` (a body trickling in), is closed.

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
MAX_CONNECTIONS = 1024
#: Descriptors kept for everything else before the control API takes any (as gRPC does).
RESERVED_FILES = 1024
#: Connections that may wait without a request in progress before the waiting ones are weeded.
MAX_WAITING = 32
#: Seconds a connection may wait without a request while more than MAX_WAITING do.
PRESSED_WAIT_S = 0.25
#: Seconds between two weedings while more than MAX_WAITING connections are open.
WEED_EVERY_S = 0.1
#: Seconds a connection may stay open without starting a request.
REQUEST_START_TIMEOUT_S = 10.0
#: Seconds a request may take from its headers to its answer's end.
REQUEST_TIMEOUT_S = 60.0
#: Seconds between two log lines about the same event-loop error.
REPEAT_INTERVAL_S = 10.0


def max_connections(open_files: int) -> int:
    """Control-API connections kept at most with a soft descriptor limit of `open_files` (a
    quarter of those left after the reserve: gRPC takes half)."""
    return max(64, min(MAX_CONNECTIONS, (open_files - RESERVED_FILES) // 4))


class GuardedH11Protocol(H11Protocol):
    #: Set per server by `guarded_protocol`.
    max_connections = 64

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened_at = time.monotonic()
        self._seen_cycle: object = None
        if len(self.connections) > self.max_connections:
            transport.close()
            return
        self._start_timer = self.loop.call_later(REQUEST_START_TIMEOUT_S, self._close_if_stalled)
        state = self.server_state
        if len(self.connections) > MAX_WAITING and getattr(state, "ringmaster_weeding", None) is None:
            state.ringmaster_weeding = self.loop.call_later(WEED_EVERY_S, _weed, self.loop, state)  # type: ignore[attr-defined]

    def waiting(self) -> bool:
        """Open without a request in progress (new, or between two requests)."""
        return not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete)

    def _close_if_stalled(self) -> None:
        """Close a connection that started no request since the last look, or whose request has
        been in progress for REQUEST_TIMEOUT_S; else look again later."""
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or (cycle is self._seen_cycle and cycle.response_complete):
            self.transport.close()  # no new request within REQUEST_START_TIMEOUT_S
            return
        if cycle is not self._seen_cycle:
            self._seen_cycle, self._cycle_seen_at = cycle, time.monotonic()
        elif not cycle.response_complete and time.monotonic() - self._cycle_seen_at >= REQUEST_TIMEOUT_S:
            self.transport.close()
            return
        self._start_timer = self.loop.call_later(REQUEST_START_TIMEOUT_S, self._close_if_stalled)

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_start_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)


def guarded_protocol(open_files: int) -> type[GuardedH11Protocol]:
    """The protocol class for a control API in a process allowed `open_files` descriptors."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"max_connections": max_connections(open_files)})


def _weed(loop: asyncio.AbstractEventLoop, state: Any) -> None:
    """Close connections that waited PRESSED_WAIT_S without a request, oldest first, while more
    than MAX_WAITING wait; look again soon while more than MAX_WAITING connections are open."""
    state.ringmaster_weeding = None
    waiting = sorted((c for c in state.connections if isinstance(c, GuardedH11Protocol) and c.waiting()),
                     key=lambda c: c._opened_at)
    now = time.monotonic()
    for connection in waiting[:max(0, len(waiting) - MAX_WAITING)]:
        if now - connection._opened_at >= PRESSED_WAIT_S:
            connection.transport.close()
    if len(state.connections) > MAX_WAITING:
        state.ringmaster_weeding = loop.call_later(WEED_EVERY_S, _weed, loop, state)


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
