"""The temporary folders of agents that died without cleaning up after themselves.

An agent keeps two folders in the temporary directory (where its workers are marked before it
stops them, and where they send their beats); it removes them when it stops, but an agent that
is killed leaves them behind, and a host whose agents are killed often fills its temporary
directory with them. Their names carry the agent's pid, so an agent starting removes those of
agents that are no longer running (a pid now held by something else counts as gone).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

#: Every folder an agent makes starts with this, then its kind, its pid and tempfile's suffix.
PREFIX = "ringmaster-agent-"
_NAMED = re.compile(rf"^{re.escape(PREFIX)}(?:stops|beats)-(\d+)-")


def folder_prefix(kind: str) -> str:
    """The `tempfile.mkdtemp` prefix of this agent's folder of `kind` (its pid in the name)."""
    return f"{PREFIX}{kind}-{os.getpid()}-"


def remove_dead_agents_folders(directory: str | None = None) -> list[str]:
    """Remove the folders of agents of this user that are no longer running; the names removed."""
    directory = directory or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = _NAMED.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not _agent_running(int(match.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def _agent_running(pid: int) -> bool:
    """Is `pid` a running Ringmaster agent (not a process that took the pid over since)?"""
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"ringmaster" in f.read()
    except OSError:
        return False
