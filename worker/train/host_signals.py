"""A worker outlives the SIGTERM that is meant for its whole host.

Kubernetes, Slurm, a terminal's Ctrl-C and `kill -TERM -PGID` signal every process of a host (or
of its process group) at once, the worker along with its agent. The agent turns that signal
into a drain: the worker must go on to its next commit and leave there, with nothing rolled
back. So under an agent a worker's first SIGTERM (or SIGINT) is not its death: it says so and
trains on. When the agent itself wants the worker gone it marks it first (a file named by the
worker's pid in `$RINGMASTER_AGENT_STOPS`), and that SIGTERM ends the worker at once, as does a
second signal from anyone: a worker is never made unkillable.

A Python handler runs between bytecodes of the main thread, so a worker blocked in a long
collective notices a marked SIGTERM when the collective returns; the agent's SIGKILL after its
stop grace covers a worker that never does.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

from ringmaster.proto import environment as env_names


def shield_from_host_signals(environ: dict[str, str] | None = None) -> bool:
    """Install the handlers (main thread, under an agent only); True if installed."""
    environ = dict(os.environ) if environ is None else environ
    stops = environ.get(env_names.AGENT_STOPS, "")
    if not stops or threading.current_thread() is not threading.main_thread():
        return False
    handler = _Handler(stops)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return True


class _Handler:
    def __init__(self, stops: str) -> None:
        self.stops = stops
        self.received = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if self.received > 1 or os.path.exists(os.path.join(self.stops, str(os.getpid()))):
            die_of(signum)
        name = signal.Signals(signum).name
        print(f"ringmaster: {name} came to this whole host: the worker trains on and leaves at its next commit as "
              f"its agent drains the host (send {name} again to stop it now)", file=sys.stderr, flush=True)


def die_of(signum: int) -> None:
    """End the process as the signal's default action would (its exit says which signal)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
