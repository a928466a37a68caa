"""Emulated hosts on this machine: one agent process per discovered host name.

Each agent leads its own process group (its workers stay in it), so killing that group is the
death of a host. An agent is started for every host the job can use now (`hosts_wanted`: not
blacklisted, within --max-np's slots) whose previous agent the rendezvous has seen go; all are
killed when the job ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ringmaster.common.secret import SECRET_ENV
from ringmaster.rendezvous.control.coordinator import Coordinator


class LocalHosts:
    def __init__(self, rendezvous_address: str, heartbeat_interval_s: float, stop_grace_s: float,
                 secret: str | None = None) -> None:
        """`secret` reaches the agents in their environment, never on their command line."""
        self._address = rendezvous_address
        self._secret = secret
        self._heartbeat = heartbeat_interval_s
        self._grace = stop_grace_s
        self.agents: dict[str, subprocess.Popen] = {}

    def reconcile(self, coordinator: Coordinator, now: float) -> None:
        """Start agents for usable hosts that have none; stop those of hosts that left."""
        busy = {w.host for w in coordinator.live_workers()}
        for name, proc in list(self.agents.items()):
            if proc.poll() is not None:
                del self.agents[name]
                continue
            host = coordinator.hosts.get(name)
            if host is not None and not host.discovered and name not in busy:
                _signal_group(proc, signal.SIGTERM)
        for name in coordinator.hosts_wanted(now):
            if coordinator.hosts[name].agent_connected or name in self.agents:
                continue
            self.agents[name] = self._spawn(name)

    def _spawn(self, host: str) -> subprocess.Popen:
        argv = [
            sys.executable, "-m", "ringmaster.worker.agent", "--rendezvous", self._address, "--host", host,
            "--heartbeat-interval", str(self._heartbeat), "--stop-grace", str(self._grace), "--die-with-parent",
        ]
        env = dict(os.environ)
        env.pop(SECRET_ENV, None)
        if self._secret is not None:
            env[SECRET_ENV] = self._secret
        return subprocess.Popen(argv, start_new_session=True, env=env)

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """Ask every agent to stop (SIGTERM to its group), then kill what is left."""
        for proc in self.agents.values():
            _signal_group(proc, signal.SIGTERM)
        for proc in self.agents.values():
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        self.agents.clear()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
