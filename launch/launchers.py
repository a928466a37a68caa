"""Launchers: how the agents of a job's hosts are started, stopped, and said to have ended.

A launcher is one class behind `Launcher`: `start(host)` and `stop(host)` act on the pool's
effects (`LaunchAgent`, `StopLaunchedAgent`), and `ended()` says which agents ended since it was
last asked, and how, which goes back to the pool as an input (`agent_process_ended`) through the
same path as every other input. A new engine (Slurm, Ray, Kubernetes) is one more class here.

- `LocalLauncher` (`--launcher local`): every host's agent runs on this machine, leading its own
  process group (its workers stay in it, so killing that group is the death of a host).
- `SshLauncher` (`--launcher ssh`): a host that is this machine runs its agent here; any other
  gets `ssh host ... agent --from-launcher`.
- `SlurmLauncher` (`--launcher slurm`, by itself inside a Slurm job): each node's agent is a job
  step, `srun --nodes=1 --ntasks=1 --overlap --nodelist=NODE ... agent --from-launcher`: Slurm
  tracks it and kills it with the job; nothing goes over ssh.
- `NoLauncher` (`--launcher none`): something else starts the agents (`ringmaster serve`).

Every agent gets its host's key (`keys.agent_key`, never the job secret) on its stdin (and a
remote one the launching environment too), which stays open; when this process or the
connection goes, the agent stops its workers. An agent (or its ssh) that ends before it
connected is a host that cannot be reached: the pool hears it with the last lines it printed,
and the blacklist's rules apply.
"""

from __future__ import annotations

import collections
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ringmaster.common import console
from ringmaster.common.handover import handover
from ringmaster.common.keys import agent_key
from ringmaster.common.network import is_this_machine, this_machine_names
from ringmaster.common.processes import dying_with_parent
from ringmaster.common.secret import SECRET_ENV
from ringmaster.launch.launch_plan import (
    SRUN_OPTIONS_ENV,
    SshOptions,
    agent_command,
    forwarded_environment,
    srun_command,
    ssh_command,
)
from ringmaster.proto import environment as env_names

#: Lines of an agent's (or its ssh's) output kept to say why it failed.
KEPT_LINES = 5
#: Seconds the end of `run` waits for an agent's last lines to be copied.
RELAY_DRAIN_S = 2.0


@dataclass(frozen=True)
class AgentOptions:
    """What every agent a launcher starts is told: where the rendezvous is, and the job's timings."""

    rendezvous: str
    heartbeat_interval_s: float
    stop_grace_s: float
    reconnect_timeout_s: float | None = None
    spares: int | None = None
    drain_grace_s: float | None = None
    notice_script: str | None = None
    notice_interval_s: float | None = None


@dataclass
class _Launched:
    proc: subprocess.Popen
    remote: bool
    via: str = "its agent"  # what was started: its agent, or what starts it (ssh, srun)
    output: collections.deque = field(default_factory=lambda: collections.deque(maxlen=KEPT_LINES))
    relays: list[threading.Thread] = field(default_factory=list)  # copying its output to ours
    exited_seen_at: float | None = None  # when `finished` first saw the process gone

    def finished(self) -> bool:
        """Whether it exited and its last lines were copied. The relays read on after the exit
        (a process that printed why and exited at once is gone before they saw the line); one
        of its children may still hold the pipe, so they are not waited for past `RELAY_DRAIN_S`."""
        if self.proc.poll() is None:
            return False
        now = time.monotonic()
        if self.exited_seen_at is None:
            self.exited_seen_at = now
        return not any(relay.is_alive() for relay in self.relays) or now - self.exited_seen_at >= RELAY_DRAIN_S


class Launcher:
    """Starts and stops the agents of hosts, and says how each ended. This base class starts none."""

    #: Whether this launcher starts agents at all (the pool asks for them only then).
    starts_agents = False

    def start(self, host: str) -> None:
        """Start the agent of `host` (its end, even at once, is said by `ended`)."""

    def stop(self, host: str) -> None:
        """Stop the agent started for `host` (its host left and runs nothing)."""

    def ended(self) -> list[tuple[str, str]]:
        """(host, how it ended) for each agent that ended since the last call."""
        return []

    def alive(self) -> int:
        """Agents (or their connections) still running."""
        return 0

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """Stop every agent, and kill what is left after `timeout_s`."""

    @classmethod
    def remote_hosts(cls, hosts: list[str]) -> list[str]:
        """Which of `hosts` this launcher reaches on other machines (the addresses follow them)."""
        return []


class NoLauncher(Launcher):
    """`--launcher none`: agents are started by something else and connect by themselves."""


class LocalLauncher(Launcher):
    """`--launcher local`: every host's agent on this machine (hosts emulated by name)."""

    starts_agents = True

    def __init__(self, options: AgentOptions, secret: str | None,
                 on_event: Callable[[str, str], None] = lambda host, how: None, key: str | None = None,
                 environment: dict[str, str] | None = None) -> None:
        """Each agent gets its host's key derived from `secret` (or `key` itself, hex, for a pool's
        host agent, which holds no secret) on its stdin, never on a command line or in its
        environment. `on_event(host, how)` hears of each start."""
        self._options = options
        self._secret = secret
        self._given_key = key
        self._extra_environment = dict(environment or {})  # set for its agents (and so their workers)
        self._on_event = on_event
        self._finished: list[tuple[str, str]] = []  # ended before they started
        self.agents: dict[str, _Launched] = {}

    def _key(self, host: str) -> str:
        if self._given_key is not None:
            return self._given_key
        return agent_key(self._secret, host).hex() if self._secret is not None else ""

    def _argv(self, host: str, remote: bool) -> list[str]:
        o = self._options
        return agent_command(sys.executable, o.rendezvous, host, o.heartbeat_interval_s, o.stop_grace_s, remote=remote,
                             reconnect_timeout_s=o.reconnect_timeout_s, spares=o.spares, drain_grace_s=o.drain_grace_s,
                             notice_script=o.notice_script, notice_interval_s=o.notice_interval_s)

    _names: set[str] | None = None

    def _machine_names(self) -> set[str]:
        """This machine's names, looked up once (a lookup of its own name can take a while)."""
        if self._names is None:
            self._names = this_machine_names()
        return self._names

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop(SECRET_ENV, None)
        env.update(self._extra_environment)
        return env

    #: Whether `start` hands the agent its key at once (an agent started ahead of its job gets
    #: it later, with its order: `hand_over`).
    hands_over_at_start = True

    def start(self, host: str) -> None:
        if host in self.agents:
            return
        self._on_event(host, "on this machine")
        env = self._environment()
        if not is_this_machine(host, self._machine_names()):  # an emulated host: its cores are every agent's here
            env[env_names.SHARED_MACHINE] = "1"
        proc = subprocess.Popen(self._argv(host, remote=False), start_new_session=True, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        launched = self.agents[host] = _Launched(proc, remote=False)
        launched.relays = [_relay_thread(proc.stdout, sys.stdout, launched.output),
                           _relay_thread(proc.stderr, sys.stderr, launched.output)]
        if self.hands_over_at_start:
            _hand_over(proc, handover(self._key(host), {}))

    def hand_over(self, host: str, line: bytes) -> bool:
        """Write a handover to the agent of `host` started without one; False when it is gone."""
        launched = self.agents.get(host)
        if launched is None or launched.proc.poll() is not None:
            return False
        _hand_over(launched.proc, line)
        return True

    def stop(self, host: str) -> None:
        """Close the agent's stdin: it stops at once (a SIGTERM would ask it to drain its host)."""
        launched = self.agents.get(host)
        if launched is not None and launched.proc.stdin is not None:
            try:
                launched.proc.stdin.close()
            except OSError:
                pass

    def ended(self) -> list[tuple[str, str]]:
        out, self._finished = self._finished, []
        for host, launched in list(self.agents.items()):
            if launched.finished():
                del self.agents[host]
                out.append((host, self._why(launched)))
        return out

    @staticmethod
    def _why(launched: _Launched) -> str:
        said = " / ".join(line for line in launched.output if line) or "(it printed nothing)"
        return f"{launched.via} exited with code {launched.proc.returncode} before the agent connected: {said}"

    def alive(self) -> int:
        for host, launched in list(self.agents.items()):
            if launched.finished():
                del self.agents[host]
                self._finished.append((host, self._why(launched)))
        return len(self.agents)

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """Ask every agent to stop (its stdin closes: it stops its workers and exits; a SIGTERM
        would ask it to drain its host instead), then kill what is left."""
        for launched in self.agents.values():
            if launched.proc.stdin is not None:
                try:
                    launched.proc.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + timeout_s
        for launched in self.agents.values():
            try:
                launched.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(launched.proc, signal.SIGKILL)
            launched.proc.wait()
        for launched in self.agents.values():
            for relay in launched.relays:
                relay.join(RELAY_DRAIN_S)  # the agents' last lines are printed before `run` ends
        self.agents.clear()


class SshLauncher(LocalLauncher):
    """`--launcher ssh` (horovodrun's way): a host that is this machine runs its agent here; any
    other gets `ssh host ... agent --from-launcher`, with the key and the environment on stdin."""

    def __init__(self, options: AgentOptions, secret: str | None, ssh: SshOptions = SshOptions(),
                 on_event: Callable[[str, str], None] = lambda host, how: None) -> None:
        super().__init__(options, secret, on_event)
        self._ssh = ssh
        self._on_loopback = is_this_machine(options.rendezvous.rsplit(":", 1)[0], {"localhost"})

    @classmethod
    def remote_hosts(cls, hosts: list[str]) -> list[str]:
        names = this_machine_names()
        return [h for h in hosts if not is_this_machine(h, names)]

    def start(self, host: str) -> None:
        if is_this_machine(host, self._machine_names()):
            super().start(host)
            return
        if host in self.agents:
            return
        if self._on_loopback:
            self._finished.append((host, f"the rendezvous listens on {self._options.rendezvous}, which another machine "
                                         "cannot dial; give --network-interface NAME or --bind ADDRESS (an address of "
                                         "this machine that it reaches)"))
            return
        env = self._environment()
        argv = ssh_command(host, self._ssh, self._argv(host, remote=True), os.getcwd())
        self._on_event(host, f"over ssh ({' '.join(argv[:-2])} ...)")
        proc = subprocess.Popen(dying_with_parent(argv), start_new_session=True, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        launched = _Launched(proc, remote=True, via="ssh")
        self.agents[host] = launched
        launched.relays = [_relay_thread(proc.stdout, sys.stdout, launched.output)]
        _hand_over(proc, handover(self._key(host), forwarded_environment(env)))


class SlurmLauncher(LocalLauncher):
    """`--launcher slurm`: each host is a node of the Slurm job this process runs in, and its agent
    a job step started with `srun` (the key on its stdin, which srun forwards and keeps open)."""

    @classmethod
    def remote_hosts(cls, hosts: list[str]) -> list[str]:
        names = this_machine_names()
        return [h for h in hosts if not is_this_machine(h, names)]

    def start(self, host: str) -> None:
        if host in self.agents:
            return
        env = self._environment()
        argv = srun_command(host, self._argv(host, remote=True), tuple(shlex.split(env.get(SRUN_OPTIONS_ENV, ""))))
        self._on_event(host, f"as a Slurm job step ({' '.join(argv[:8])} ...)")
        try:
            proc = subprocess.Popen(dying_with_parent(argv), start_new_session=True, env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:  # no srun here
            self._finished.append((host, f"srun could not be started: {exc}"))
            return
        launched = _Launched(proc, remote=True, via="srun")
        self.agents[host] = launched
        launched.relays = [_relay_thread(proc.stdout, sys.stdout, launched.output)]
        _hand_over(proc, handover(self._key(host), {}))


#: What builds a launcher that is not one `--launcher` names (a pool's, for its joined hosts):
#: the agents' options and the job secret in.
LauncherFactory = Callable[[AgentOptions, "str | None"], Launcher]

#: The launchers `--launcher` names.
LAUNCHERS: dict[str, type[Launcher]] = {"ssh": SshLauncher, "local": LocalLauncher, "slurm": SlurmLauncher,
                                         "none": NoLauncher}


def make_launcher(name: str, options: AgentOptions, secret: str | None, ssh: SshOptions = SshOptions(),
                  on_event: Callable[[str, str], None] = lambda host, how: None) -> Launcher:
    """The launcher `--launcher NAME` asks for."""
    kind = LAUNCHERS[name]
    if kind is SshLauncher:
        return SshLauncher(options, secret, ssh, on_event)
    if kind is SlurmLauncher:
        return SlurmLauncher(options, secret, on_event)
    if kind is LocalLauncher:
        return LocalLauncher(options, secret, on_event)
    return NoLauncher()


def _hand_over(proc: subprocess.Popen, line: bytes) -> None:
    """Write an agent's handover to its stdin, which stays open: its end is the end of the launcher."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(line)
        proc.stdin.flush()
    except OSError:
        pass  # the agent (or ssh) is gone already: `ended` says so with what it printed


def _relay_thread(pipe, sink, kept: collections.deque) -> threading.Thread:
    thread = threading.Thread(target=_relay, args=(pipe, sink, kept), daemon=True)
    thread.start()
    return thread


def _relay(pipe, sink, kept: collections.deque) -> None:
    """Copy what an agent (and its workers, or ssh) prints to ours, line by line through the
    console (so `run`'s status line is cleared first), keeping the last lines."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        kept.append(line[:500])
        console.write(sink, line + "\n")
    pipe.close()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
