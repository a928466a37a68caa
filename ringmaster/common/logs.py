"""Standard `logging` for every Ringmaster process: one logger per concern, one handler.

Loggers: `ringmaster.rendezvous` (decisions and the server), `ringmaster.store` (durable state,
leadership), `ringmaster.agent` (host agents), `ringmaster.worker` (the training library),
`ringmaster.cli`. Console lines keep their familiar shape (`ringmaster: [gen 3] generation 3
formed: ...`); `--log-format json` (or RINGMASTER_LOG_FORMAT=json, which agents and workers
inherit) prints one JSON object per line with the event's kind and fields instead.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
from typing import Any, TextIO

from ringmaster.common.events import Event

#: Environment variables that carry the choice to agents and workers.
LOG_FORMAT_ENV = "RINGMASTER_LOG_FORMAT"
LOG_LEVEL_ENV = "RINGMASTER_LOG_LEVEL"
FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_FORMAT = "text"
DEFAULT_LEVEL = "INFO"

ROOT = "ringmaster"
RENDEZVOUS = "ringmaster.rendezvous"
STORE = "ringmaster.store"
AGENT = "ringmaster.agent"
POOL_AGENT = "ringmaster.pool_agent"
WORKER = "ringmaster.worker"
CLI = "ringmaster.cli"

#: The job a record is about, in a process that leads many (`ringmaster pool serve` sets it in each
#: job's task; asyncio copies it into every task that job starts): `[job]` on the console, `job`
#: in JSON. None in a process of one job.
JOB_LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("ringmaster_job", default=None)

#: Console prefix per logger (a record's `host`, set by the agent, fills `{host}`).
_PREFIXES = {AGENT: "ringmaster-agent[{host}]", WORKER: "ringmaster-worker", POOL_AGENT: "ringmaster-pool-agent"}


def _prefix(record: logging.LogRecord) -> str:
    for name, prefix in _PREFIXES.items():
        if record.name == name or record.name.startswith(name + "."):
            return prefix.format(host=getattr(record, "host", "?"))
    return "ringmaster"


class TextFormatter(logging.Formatter):
    """`ringmaster: [gen N] message`: what users read on the console."""

    def format(self, record: logging.LogRecord) -> str:
        event: Event | None = getattr(record, "event", None)
        generation = f"[gen {event.generation}] " if event is not None and event.generation is not None else ""
        job = JOB_LABEL.get()
        text = f"{_prefix(record)}{f'[{job}]' if job else ''}: {generation}{record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: the event's kind, generation and fields, plus the message."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"logger": record.name, "level": record.levelname, "message": record.getMessage()}
        host = getattr(record, "host", None)
        if host is not None:
            line["host"] = host
        job = JOB_LABEL.get()
        if job is not None:
            line["job"] = job
        line["time"] = record.created
        event: Event | None = getattr(record, "event", None)
        if event is not None:
            line.update(event.as_dict())
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _OurHandler(logging.StreamHandler):
    """Marks the handler `configure` installed, so that a second call replaces it."""


def configure(fmt: str | None = None, level: str | None = None, stream: TextIO | None = None) -> None:
    """Send the `ringmaster` loggers to stderr in `fmt` ("text" or "json") at `level`.

    Unset arguments come from RINGMASTER_LOG_FORMAT / RINGMASTER_LOG_LEVEL, then the defaults;
    the choice is written back to the environment so that child processes (agents, workers)
    log the same way. Calling it again replaces the earlier set-up; other loggers (the
    training script's, the root logger) are left alone."""
    fmt = (fmt or os.environ.get(LOG_FORMAT_ENV) or DEFAULT_FORMAT).lower()
    level = (level or os.environ.get(LOG_LEVEL_ENV) or DEFAULT_LEVEL).upper()
    if fmt not in FORMATS:
        fmt = DEFAULT_FORMAT
    if level not in LEVELS:
        level = DEFAULT_LEVEL
    os.environ[LOG_FORMAT_ENV], os.environ[LOG_LEVEL_ENV] = fmt, level
    logger = logging.getLogger(ROOT)
    for handler in [h for h in logger.handlers if isinstance(h, _OurHandler)]:
        logger.removeHandler(handler)
    handler = _OurHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def configured() -> bool:
    """Has `configure` run in this process?"""
    return any(isinstance(h, _OurHandler) for h in logging.getLogger(ROOT).handlers)
