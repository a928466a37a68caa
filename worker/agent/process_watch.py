"""Which of the host's worker processes are busy, as the kernel says: the agent's word on a
worker whose own heartbeats stopped.

A worker's heartbeat comes from a thread of its training process, so a busy interpreter (torch's
imports on a loaded host, a long C call that holds the GIL) falls silent exactly as a dead or
stopped one does. The agent beside it can tell them apart from `/proc/PID/stat`: a process that
is running, or sleeping while its CPU time still grows, is busy; one that is stopped (SIGSTOP,
a debugger), a zombie, gone, or asleep without any CPU time since the last look is not. The
rendezvous gives a busy worker's silence a longer budget (`--busy-timeout`) and never blames its
host for it (`Coordinator.tick`).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

#: Process states of `/proc/PID/stat` that are neither running nor able to run again by
#: themselves: stopped, traced, zombie, dead.
NOT_BUSY_STATES = frozenset("TtZXx")
#: States in which a process is working even when its CPU time did not grow in between (running,
#: waiting for the disk: an import reading files).
WORKING_STATES = frozenset("RD")


class ProcessSample(NamedTuple):
    state: str
    cpu_ticks: int


def parse_stat(text: str) -> ProcessSample | None:
    """The state and CPU time (user + system, in clock ticks) of one `/proc/PID/stat` line;
    None if it is not one (the name in parentheses may hold spaces and parentheses itself)."""
    end = text.rfind(")")
    if end < 0:
        return None
    fields = text[end + 1:].split()
    try:  # after the name: state, ppid, ... utime is the 14th field of the line, stime the 15th
        return ProcessSample(fields[0], int(fields[11]) + int(fields[12]))
    except (IndexError, ValueError):
        return None


def is_busy(sample: ProcessSample | None, before: ProcessSample | None) -> bool:
    """Whether a process sampled as `sample` (None: gone) is busy, given its previous sample."""
    if sample is None or sample.state in NOT_BUSY_STATES:
        return False
    if sample.state in WORKING_STATES:
        return True
    return before is not None and sample.cpu_ticks > before.cpu_ticks


def read_stat(pid: int) -> ProcessSample | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_stat(f.read())
    except OSError:
        return None


class ProcessWatch:
    """Samples the host's worker processes at each agent heartbeat and says which are busy."""

    def __init__(self, read=read_stat) -> None:
        self._read = read
        self._last: dict[int, ProcessSample] = {}

    def busy(self, workers: Iterable[tuple[str, int]]) -> list[str]:
        """The ids of `workers` ((worker id, pid) pairs) whose processes are busy now."""
        out: list[str] = []
        seen: dict[int, ProcessSample] = {}
        for worker_id, pid in workers:
            sample = self._read(pid)
            if is_busy(sample, self._last.get(pid)):
                out.append(worker_id)
            if sample is not None:
                seen[pid] = sample
        self._last = seen
        return out
