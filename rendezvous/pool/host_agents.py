"""Starting a pool agent on each host the pool was given (`-H`, a discovery script), with the
launcher `run` would use (local, ssh, Slurm): so every host of a pool, however it came, runs one
`ringmaster pool agent` that serves every job placed there (the same path as hosts that join by
connecting, `host_board`).

The launcher classes are `run`'s; only what they start differs: `ringmaster pool agent --pool URL
--host H --slots N --from-launcher` with the host's pool key (derived from the pool's join secret)
on its stdin, never on its command line or in its environment; it stops when its stdin closes.
"""

from __future__ import annotations

import sys
from typing import Callable

from ringmaster.common.keys import pool_host_key
from ringmaster.launch.launch_plan import SshOptions
from ringmaster.launch.launchers import AgentOptions, Launcher, LocalLauncher, SlurmLauncher, SshLauncher


def pool_agent_command(python: str, pool_url: str, host: str, slots: int, remote: bool) -> list[str]:
    """The pool agent's argv: its key (and, when `remote`, the environment) come on stdin."""
    argv = [python, "-m", "ringmaster.cli", "pool", "agent", "--pool", pool_url, "--host", host, "--slots", str(slots),
            "--from-launcher"]
    return argv if remote else [*argv, "--die-with-parent"]


class _PoolAgents:
    """What a launcher starts for a pool: its hosts' pool agents."""

    pool_url: str = ""
    join_secret: str = ""
    slots_of: Callable[[str], int]  # set by `pool_agent_launcher`

    def _argv(self, host: str, remote: bool) -> list[str]:
        return pool_agent_command(sys.executable, self.pool_url, host, self.slots_of(host), remote)

    def _key(self, host: str) -> str:
        return pool_host_key(self.join_secret, host).hex()


class LocalPoolAgents(_PoolAgents, LocalLauncher):
    """`--launcher local`: every host's pool agent on this machine (hosts emulated by name)."""


class SshPoolAgents(_PoolAgents, SshLauncher):
    """`--launcher ssh`: a host's pool agent over ssh (here when the host is this machine)."""


class SlurmPoolAgents(_PoolAgents, SlurmLauncher):
    """`--launcher slurm`: each node's pool agent a job step of the allocation."""


_KINDS: dict[str, type[LocalLauncher]] = {"local": LocalPoolAgents, "ssh": SshPoolAgents, "slurm": SlurmPoolAgents}


def pool_agent_launcher(name: str, pool_url: str, join_secret: str, slots_of: Callable[[str], int], ssh: SshOptions,
                        on_event: Callable[[str, str], None]) -> Launcher:
    """The launcher `--launcher NAME` names, starting pool agents for the pool at `pool_url`
    (`slots_of(host)`: its slots, read when its agent starts)."""
    kind = _KINDS[name]
    address = pool_url.split("://", 1)[-1]  # what the ssh launcher checks another machine can dial
    options = AgentOptions(address, 1.0, 1.0)
    launcher: LocalLauncher = SshPoolAgents(options, None, ssh, on_event) if kind is SshPoolAgents \
        else kind(options, None, on_event)
    assert isinstance(launcher, _PoolAgents)
    launcher.pool_url, launcher.join_secret = pool_url, join_secret
    launcher.slots_of = slots_of
    return launcher
