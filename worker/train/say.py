"""How the training library tells what happened in a worker: structured events on the
`ringmaster.worker` logger (stderr; the agent prefixes each line with the worker's id)."""

from __future__ import annotations

import logging

from ringmaster.common import logs
from ringmaster.common.events import Event, Kind, log_event

_logger = logging.getLogger(logs.WORKER)


def say(kind: Kind, generation: int | None = None, /, **fields: object) -> None:
    """Log one of this worker's events. Logging is set up on first use from
    RINGMASTER_LOG_FORMAT/_LEVEL, which the launcher passes down, unless the script set up the
    `ringmaster` loggers itself."""
    if not logs.configured() and not logging.getLogger(logs.ROOT).handlers:
        logs.configure()
    log_event(_logger, Event(kind, fields, generation))


__all__ = ["Kind", "say"]
