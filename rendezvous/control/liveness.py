"""Whether a worker's silence means it is dead, hung or only busy: a pure rule, times given.

A worker's heartbeats come from a thread of its training process, so they stop when the
interpreter is busy (imports on a loaded host, a C call holding the GIL) as when it is stopped
or dead. Its agent says at each of its own heartbeats which of its workers' processes the kernel
shows busy (`worker/agent/process_watch.py`). A silent worker is busy when its agent vouched for
it within the last two of the agent's heartbeat intervals, or when the agent's latest word named
it and the agent has not spoken since (a loaded host delays its agent's beats as it delays its
workers': a late beat must not turn busy workers into dead ones, and it was one beside a CPU hog).
A busy worker has `--busy-timeout` before it counts as hung, and its host is not blamed (a slow
start is no fault of the host). Any other silence counts after `--heartbeat-timeout`, as before:
a SIGSTOPped, zombie or vanished worker is found at the agent's next beat that does not name it.
"""

from __future__ import annotations

from typing import NamedTuple

#: An agent's word that a process is busy holds for this many of the agent's heartbeat intervals
#: (one late beat on a loaded host must not turn a busy worker into a dead one).
VOUCH_INTERVALS = 2.0


class Silence(NamedTuple):
    failed: bool  # the worker counts as failed now
    busy: bool  # its agent vouched that its process was busy
    reason: str


def judge_silence(silent_s: float, vouched_s: float | None, timeout_s: float, busy_timeout_s: float,
                  agent_beat_s: float, agent_silent_s: float | None = None,
                  agent_timeout_s: float = 0.0) -> Silence:
    """`silent_s`: seconds since the worker's last heartbeat; `vouched_s`: seconds since its agent
    last said its process was busy (None: never); `agent_silent_s`: seconds since its agent last
    spoke at all (None: not connected), its word standing until `agent_timeout_s`."""
    if silent_s <= timeout_s:
        return Silence(False, False, "")
    recent = vouched_s is not None and vouched_s <= VOUCH_INTERVALS * agent_beat_s
    latest_word = (vouched_s is not None and agent_silent_s is not None and vouched_s <= agent_silent_s
                   and agent_silent_s <= agent_timeout_s)
    busy = recent or latest_word
    if not busy:
        return Silence(True, False, f"sent no heartbeat for {silent_s:.1f} s (hung or stopped)")
    limit = max(timeout_s, busy_timeout_s)
    if silent_s <= limit:
        return Silence(False, True, "")
    return Silence(True, True, f"sent no heartbeat for {silent_s:.1f} s while its process kept busy "
                               f"(--busy-timeout {busy_timeout_s:g} s)")
