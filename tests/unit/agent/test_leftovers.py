"""An agent starting removes the temporary folders of agents that are no longer running, and
only those: its own, a running agent's, another user's and anything else stay."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from harness import wait_for

from ringmaster.worker.agent.leftovers import folder_prefix, remove_dead_agents_folders


def test_the_folders_of_dead_agents_go_and_every_other_stays(tmp_path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # (a pid nobody holds now)
    other = subprocess.Popen(["sleep", "30"])  # a live process that is no agent: its pid was taken over
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "ringmaster.worker.agent"])
    try:
        # (Popen returns once the child exists, maybe before its exec: until then its command line is this one's)
        wait_for(lambda: b"ringmaster.worker.agent" in pathlib.Path(f"/proc/{agent.pid}/cmdline").read_bytes(), 30,
                 "the stand-in agent's exec")
        names = {
            "dead": f"ringmaster-agent-stops-{gone.pid}-abc",
            "dead beats": f"ringmaster-agent-beats-{gone.pid}-def",
            "taken over": f"ringmaster-agent-beats-{other.pid}-ghi",
            "running agent": f"ringmaster-agent-stops-{agent.pid}-jkl",
            "own": f"{folder_prefix('stops')}mno",
            "old format": "ringmaster-agent-stops-pqr",
            "not ours": "something-else-1-stu",
        }
        for name in names.values():
            (tmp_path / name).mkdir()
        removed = remove_dead_agents_folders(str(tmp_path))
        assert sorted(removed) == sorted([names["dead"], names["dead beats"], names["taken over"]])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            names[k] for k in ("running agent", "own", "old format", "not ours"))
        assert folder_prefix("beats").startswith(f"ringmaster-agent-beats-{os.getpid()}-")
    finally:
        other.kill()
        agent.kill()
        other.wait()
        agent.wait()
