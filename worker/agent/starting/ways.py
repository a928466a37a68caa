"""The ways an agent starts a worker, in the order they are tried: the first that gives a process
wins, and the last always does (or raises, as `subprocess.Popen` raises).

1. `WarmSpare`: a spare process that has imported torch already becomes the worker at once (tens
   of milliseconds; `spare_pool.py`).
2. `TemplateFork`: forked from the agent's worker template (about 20 ms; `template.py`). A host's
   first workers wait for the template to be warm (`TEMPLATE_WAIT_S`): a fresh start would import
   torch beside the template's own import, on the same cores.
3. `ColdSpare`: a spare still importing. It began before a fresh process would, so it is ahead.
4. `FreshProcess`: the command exec'd as it would be without Ringmaster.

A way that cannot be this worker (its command or environment is not one a spare or a fork can
be told from a fresh process by, `spare_pool.spare_assignment`; the template is off) gives None
and the next is tried. Each way is a small class with one method, `start(request)`; the agent
keeps the list (`ways_for`) and calls `start_worker`.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, Union

from ringmaster.common.events import Kind
from ringmaster.common.processes import dying_with_parent
from ringmaster.worker.agent.starting.spare_pool import SparePool
from ringmaster.worker.agent.starting.template import ForkedProcess, WorkerTemplate

#: The longest the host's first workers wait for the worker template to be warm before they start
#: fresh (its imports take 2.5 s of CPU; on a loaded host, tens of seconds of the clock).
TEMPLATE_WAIT_S = 60.0

#: A worker's process, however it was started.
Process = Union[subprocess.Popen, ForkedProcess]
#: `forward(proc, prefix)`: copy a process' output, each line after the (changeable) prefix.
Forward = Callable[[Process, list[str]], None]


@dataclass(frozen=True)
class StartRequest:
    """One worker to start: its command, its whole environment and its id."""

    argv: list[str]
    env: dict[str, str]
    worker_id: str


class Way(Protocol):
    """One way to start a worker: a process, or None where this way cannot be that worker."""

    def start(self, request: StartRequest) -> Process | None: ...


@dataclass
class WarmSpare:
    """A spare that has finished its imports, where one fits the worker."""

    spares: SparePool

    def start(self, request: StartRequest) -> Process | None:
        if not self.spares.warm():
            return None
        return self.spares.take(request.argv, request.env, request.worker_id)


@dataclass
class TemplateFork:
    """Forked from the agent's worker template. `template()` gives it (started on first use) or
    None where the agent forks no workers. That a command cannot be forked is said once: a job's
    workers share their command."""

    template: Callable[[], WorkerTemplate | None]
    say: Callable[..., None]
    forward: Forward
    wait_s: float = TEMPLATE_WAIT_S
    _unfit_said: bool = field(default=False, init=False)

    def start(self, request: StartRequest) -> Process | None:
        template = self.template()
        if template is None or not template.usable:
            return None
        template.ready(self.wait_s)
        started = time.perf_counter()
        proc, why = template.fork(request.argv, request.env, request.worker_id)
        if proc is None:
            if not self._unfit_said and template.usable:
                self._unfit_said = True
                self.say(Kind.TEMPLATE_UNFIT, worker=request.worker_id, reason=why)
            return None
        self.forward(proc, [f"[{request.worker_id}] "])
        self.say(Kind.TEMPLATE_FORKED, worker=request.worker_id, pid=proc.pid,
                 took_ms=round((time.perf_counter() - started) * 1000, 1))
        return proc


@dataclass
class ColdSpare:
    """A spare still importing, where one fits the worker (it started before a fresh process would)."""

    spares: SparePool

    def start(self, request: StartRequest) -> Process | None:
        return self.spares.take(request.argv, request.env, request.worker_id)


@dataclass
class FreshProcess:
    """The command exec'd as a process of its own (dying with the agent). `started(pid)` is told
    of it: spares hold back while a fresh worker imports."""

    forward: Forward
    started: Callable[[int], None]

    def start(self, request: StartRequest) -> Process | None:
        proc = subprocess.Popen(dying_with_parent(list(request.argv)), env=request.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.forward(proc, [f"[{request.worker_id}] "])
        self.started(proc.pid)
        return proc


def ways_for(spares: SparePool, template: Callable[[], WorkerTemplate | None], say: Callable[..., None],
             forward: Forward) -> list[Way]:
    """The agent's ways, in the order they are tried."""
    return [WarmSpare(spares), TemplateFork(template, say, forward), ColdSpare(spares),
            FreshProcess(forward, spares.started_fresh)]


def start_worker(ways: Sequence[Way], request: StartRequest) -> Process:
    """The worker started the first way that can; OSError where the last cannot start it either."""
    for way in ways:
        proc = way.start(request)
        if proc is not None:
            return proc
    raise OSError(f"no way could start worker {request.worker_id}")
