"""The heartbeat interval a caller keeps when a large job's rendezvous asks for a longer one
(`Ack.heartbeat_interval_s`; the rendezvous' side is `rendezvous/control/heartbeat_pace.py`).
The answer is authenticated but still bounded: never below the caller's configured interval,
never above `MOST_INTERVAL_S` (or the caller's own bound)."""

from __future__ import annotations

import math

#: Longest interval a rendezvous asks for, and a caller accepts (seconds).
MOST_INTERVAL_S = 60.0


def paced_interval(asked_s: float, base_s: float, most_s: float = MOST_INTERVAL_S) -> float:
    """The interval to keep after an answer that asked for `asked_s` seconds (0: nothing asked)."""
    if not math.isfinite(asked_s) or asked_s <= base_s:
        return base_s
    return min(asked_s, max(base_s, min(most_s, MOST_INTERVAL_S)))
