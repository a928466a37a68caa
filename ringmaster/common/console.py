"""One writer for this process' terminal: the lines relayed from other processes (agents and
their workers) and the live status line of `ringmaster run` never land on one line.

Whoever draws something that must be cleared before other output (the status line) registers a
hook with `before_output`; `write` calls the hooks, then writes the line, under one lock that
the drawer takes too (`lock`).
"""

from __future__ import annotations

import threading
from typing import Callable, TextIO

#: Held while a line is written, by `write` and by whoever draws the status line.
lock = threading.RLock()
_hooks: list[Callable[[], None]] = []


def before_output(hook: Callable[[], None]) -> Callable[[], None]:
    """Call `hook` before each line `write` writes; returns what removes it."""
    with lock:
        _hooks.append(hook)

    def remove() -> None:
        with lock:
            if hook in _hooks:
                _hooks.remove(hook)

    return remove


def write(stream: TextIO, line: str) -> None:
    """Write one whole line (with its newline) to `stream`, the status line cleared first."""
    with lock:
        for hook in list(_hooks):
            hook()
        stream.write(line)
        stream.flush()
