"""Names in a message, bounded: a reason goes into events, logs and every member's host update,
so one that listed every newcomer of a large job (tens of thousands of worker ids) cost
megabytes per message, times every member."""

from __future__ import annotations

from typing import Iterable

#: Names a message lists before it counts the rest.
SHOWN = 8


def listed(names: Iterable[str], shown: int = SHOWN, separator: str = ", ", counted: str = "") -> str:
    """'a, b, c' or, past `shown` names, 'a, b, ... (N in all)' ('(N `counted` in all)' when
    `counted` names what is counted)."""
    every = list(names)
    if len(every) <= shown:
        return separator.join(every)
    return separator.join(every[:shown]) + f"{separator}... ({len(every)}{' ' + counted if counted else ''} in all)"
