"""The agents `ringmaster run` starts itself: one per host the job can use now.

A host that is this machine (or every host, with `--launcher local`: hosts emulated by name)
gets an agent process here, leading its own process group (its workers stay in it, so killing
that group is the death of a host). Any other host gets `ssh host ... agent --from-launcher`.
Every agent gets its host's key (`keys.agent_key`, never the job secret) on its stdin (and a
remote one the environment too), which stays open; when this process or the connection goes,
the agent stops its workers. An ssh that exits before
its agent connected is a host that cannot be reached: the coordinator is told with the last
lines ssh printed (`agent_launch_failed`), and the blacklist's rules apply.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ringmaster.common.handover import handover
from ringmaster.common.keys import agent_key
from ringmaster.common.network import is_this_machine, this_machine_names
from ringmaster.common.secret import SECRET_ENV
from ringmaster.rendezvous.control.coordinator import Coordinator
from ringmaster.rendezvous.server.launch_plan import SshOptions, agent_command, forwarded_environment, ssh_command
from ringmaster.worker.agent.processes import dying_with_parent

#: Lines of an ssh's output kept to say why it failed.
KEPT_LINES = 5


@dataclass
class _Launched:
    proc: subprocess.Popen
    remote: bool
    output: collections.deque = field(default_factory=lambda: collections.deque(maxlen=KEPT_LINES))
    connected: bool = False  # its agent opened a session at least once


class AgentLauncher:
    def __init__(self, rendezvous_address: str, heartbeat_interval_s: float, stop_grace_s: float,
                 secret: str | None = None, launcher: str = "local", ssh: SshOptions = SshOptions(),
                 on_event: Callable[[str, str], None] = lambda host, how: None,
                 reconnect_timeout_s: float | None = None, spares: int | None = None) -> None:
        """Each agent gets its host's key derived from `secret` on its stdin, never on a command
        line or in its environment. `on_event(host, how)` hears of each start."""
        self._address = rendezvous_address
        self._heartbeat = heartbeat_interval_s
        self._grace = stop_grace_s
        self._reconnect = reconnect_timeout_s
        self._spares = spares
        self._secret = secret
        self._launcher = launcher
        self._ssh = ssh
        self._on_event = on_event
        self._names = this_machine_names()
        self._on_loopback = is_this_machine(rendezvous_address.rsplit(":", 1)[0], {"localhost"})
        self.agents: dict[str, _Launched] = {}

    def is_remote(self, host: str) -> bool:
        return self._launcher == "ssh" and not is_this_machine(host, self._names)

    def reconcile(self, coordinator: Coordinator, now: float) -> None:
        """Start agents for usable hosts that have none; stop those of hosts that left; report
        hosts whose agent could not be started."""
        busy = {w.host for w in coordinator.live_workers()}
        for name, launched in list(self.agents.items()):
            host = coordinator.hosts.get(name)
            if host is not None and host.agent_connected:
                launched.connected = True
            if launched.proc.poll() is not None:
                del self.agents[name]
                if not launched.connected and host is not None and not host.agent_connected:
                    coordinator.agent_launch_failed(name, self._why(name, launched), now)
                continue
            if host is not None and not host.discovered and name not in busy:
                _signal_group(launched.proc, signal.SIGTERM)
        for name in coordinator.hosts_wanted(now):
            if coordinator.hosts[name].agent_connected or name in self.agents:
                continue
            if self.is_remote(name) and self._on_loopback:
                coordinator.agent_launch_failed(
                    name, f"the rendezvous listens on {self._address}, which another machine cannot dial; give "
                          "--network-interface NAME or --bind ADDRESS (an address of this machine that it reaches)", now)
                continue
            self.agents[name] = self._start(name)

    def _why(self, host: str, launched: _Launched) -> str:
        said = " / ".join(line for line in launched.output if line) or "(it printed nothing)"
        what = "ssh" if launched.remote else "its agent"
        return f"{what} exited with code {launched.proc.returncode} before the agent connected: {said}"

    def _start(self, host: str) -> _Launched:
        env = dict(os.environ)
        env.pop(SECRET_ENV, None)
        key = agent_key(self._secret, host).hex() if self._secret is not None else ""
        if not self.is_remote(host):
            argv = agent_command(sys.executable, self._address, host, self._heartbeat, self._grace, remote=False,
                                 reconnect_timeout_s=self._reconnect, spares=self._spares)
            self._on_event(host, "on this machine")
            launched = _Launched(subprocess.Popen(argv, start_new_session=True, env=env, stdin=subprocess.PIPE),
                                 remote=False)
            self._hand_over(launched.proc, handover(key, {}))
            return launched
        remote = agent_command(sys.executable, self._address, host, self._heartbeat, self._grace, remote=True,
                               reconnect_timeout_s=self._reconnect, spares=self._spares)
        argv = ssh_command(host, self._ssh, remote, os.getcwd())
        self._on_event(host, f"over ssh ({' '.join(argv[:-2])} ...)")
        proc = subprocess.Popen(dying_with_parent(argv), start_new_session=True, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        launched = _Launched(proc, remote=True)
        threading.Thread(target=_relay, args=(proc, launched.output), daemon=True).start()
        self._hand_over(proc, handover(key, forwarded_environment(env)))
        return launched

    @staticmethod
    def _hand_over(proc: subprocess.Popen, line: bytes) -> None:
        """Write the agent's handover to its stdin, which stays open: its end is the end of the launcher."""
        assert proc.stdin is not None
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except OSError:
            pass  # the agent (or ssh) is gone already: reported by reconcile with what it printed

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """Ask every agent to stop (SIGTERM to its group; a remote one sees its stdin close), then
        kill what is left."""
        for launched in self.agents.values():
            if launched.proc.stdin is not None:
                try:
                    launched.proc.stdin.close()
                except OSError:
                    pass
            if not launched.remote:
                _signal_group(launched.proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for launched in self.agents.values():
            try:
                launched.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(launched.proc, signal.SIGKILL)
            launched.proc.wait()
        self.agents.clear()

    def alive(self) -> int:
        """Agents (or ssh connections) still running."""
        for name, launched in list(self.agents.items()):
            if launched.proc.poll() is not None:
                del self.agents[name]
        return len(self.agents)


def _relay(proc: subprocess.Popen, kept: collections.deque) -> None:
    """Copy what a remote agent (and ssh) prints to our stdout, keeping the last lines."""
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        kept.append(line[:500])
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    proc.stdout.close()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
