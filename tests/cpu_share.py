"""Cut processes' CPU share for real, to make a slow host on one machine: a cgroup capped at a
fraction of one CPU (cgroup v2's `cpu.max`, else v1's CFS quota), the processes moved into it
(their children follow); where no cgroup can be made, the processes are stopped and continued in
turn (SIGSTOP/SIGCONT, as `cpulimit` does), which caps them just as really, more coarsely.
Everything is undone on exit, also on failure."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import threading
import uuid
from typing import Callable, Iterator

PERIOD_US = 100_000


def _cgroup_dir() -> tuple[pathlib.Path, str] | None:
    """A folder where a capped cgroup can be made, and its kind ("v2" or "v1")."""
    for root, kind in ((pathlib.Path("/sys/fs/cgroup"), "v2"), (pathlib.Path("/sys/fs/cgroup/cpu"), "v1")):
        if kind == "v2" and not (root / "cgroup.controllers").exists():
            continue
        if kind == "v2" and "cpu" not in (root / "cgroup.subtree_control").read_text().split():
            continue
        if kind == "v1" and not (root / "cpu.cfs_quota_us").exists():
            continue
        if os.access(root, os.W_OK):
            return root, kind
    return None


@contextlib.contextmanager
def cpu_share(pids: Callable[[], list[int]], fraction: float) -> Iterator[str]:
    """Cap the processes `pids()` names (asked again while capped, for processes they start) at
    `fraction` of one CPU; yields how ("cgroup v1", "cgroup v2" or "signals")."""
    found = _cgroup_dir()
    if found is not None:
        root, kind = found
        group = root / f"ringmaster-test-{uuid.uuid4().hex[:8]}"
        try:
            group.mkdir()
        except OSError:
            found = None
    if found is None:
        with _duty_cycle(pids, fraction):
            yield "signals"
        return
    quota = max(1000, int(PERIOD_US * fraction))
    if kind == "v2":
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    try:
        for pid in pids():
            with contextlib.suppress(OSError):
                (group / "cgroup.procs").write_text(str(pid))
        yield f"cgroup {kind}"
    finally:
        for line in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(line)
        with contextlib.suppress(OSError):
            group.rmdir()


@contextlib.contextmanager
def _duty_cycle(pids: Callable[[], list[int]], fraction: float) -> Iterator[None]:
    stop = threading.Event()

    def signal_all(sig: int) -> None:
        for pid in pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def cycle() -> None:
        period = PERIOD_US / 1e6
        while not stop.is_set():
            signal_all(signal.SIGCONT)
            stop.wait(period * fraction)
            signal_all(signal.SIGSTOP)
            stop.wait(period * (1 - fraction))
        signal_all(signal.SIGCONT)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        signal_all(signal.SIGCONT)


def process_group(pgid: int) -> list[int]:
    """The processes of process group `pgid` now."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:
                    found.append(int(entry.name))
    return found
