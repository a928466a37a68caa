"""How `ringmaster run` starts the agent of a host: the command, and what it hands over.

Pure: argv lists and bytes; `agent_launcher` runs them. As with horovodrun, a host that is
this machine runs its agent here; any other is reached with `ssh host <this python> -m
ringmaster.worker.agent ...`, in the same working directory. What the agent needs besides its
flags (its host's key, never the job secret; the launching environment) goes as one JSON line
on the agent's stdin (`common/handover`), never on a command line (where `ps` on either machine
shows it) nor in its environment (which its workers could read in /proc); the agent then
watches that stdin, so the end of the ssh connection is the end of the launcher.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Mapping

#: How agents are started when --launcher names none (`launchers.LAUNCHERS` has them all).
DEFAULT_LAUNCHER = "ssh"
#: Environment variable giving --launcher's default (the tests, which emulate hosts by name, set "local").
LAUNCHER_ENV = "RINGMASTER_LAUNCHER"
#: Extra `srun` flags for the agents `--launcher slurm` starts (e.g. `--mem=0 --cpu-bind=none`).
SRUN_OPTIONS_ENV = "RINGMASTER_SRUN_OPTIONS"
#: Environment variable with more `ssh` options, as a shell would split them (e.g. "-o UserKnownHostsFile=F").
SSH_OPTIONS_ENV = "RINGMASTER_SSH_OPTIONS"
#: Environment variables not forwarded to remote hosts: they describe this machine or session.
NOT_FORWARDED = frozenset({
    "HOME", "HOSTNAME", "HOST", "LOGNAME", "MAIL", "OLDPWD", "PWD", "SHELL", "SHLVL", "TERM", "TMPDIR", "USER",
    "DISPLAY", "LS_COLORS", "SSH_AUTH_SOCK", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "_", "CUDA_VISIBLE_DEVICES",
})
NOT_FORWARDED_PREFIXES = ("BASH_FUNC_", "XDG_", "SSH_")
#: Seconds ssh waits for a host to answer before giving up on it.
SSH_CONNECT_TIMEOUT_S = 10


@dataclass(frozen=True)
class SshOptions:
    """`--ssh-port`, `--ssh-identity-file`, and further `ssh` options (RINGMASTER_SSH_OPTIONS)."""

    port: int | None = None
    identity_file: str | None = None
    extra: tuple[str, ...] = field(default=())

    @classmethod
    def from_text(cls, port: int | None, identity_file: str | None, extra: str) -> "SshOptions":
        return cls(port, identity_file, tuple(shlex.split(extra)))


def agent_command(python: str, rendezvous: str, host: str, heartbeat_interval_s: float, stop_grace_s: float,
                  remote: bool, reconnect_timeout_s: float | None = None, spares: int | None = None,
                  drain_grace_s: float | None = None, notice_script: str | None = None,
                  notice_interval_s: float | None = None) -> list[str]:
    """The agent's argv. Every agent reads its host's key (and, when `remote`, the environment)
    from stdin and stops when stdin closes; a local one also dies with its parent."""
    argv = [python, "-m", "ringmaster.worker.agent", "--rendezvous", rendezvous, "--host", host,
            "--heartbeat-interval", str(heartbeat_interval_s), "--stop-grace", str(stop_grace_s)]
    if reconnect_timeout_s is not None:
        argv += ["--reconnect-timeout", str(reconnect_timeout_s)]
    if spares is not None:
        argv += ["--spares", str(spares)]
    if drain_grace_s is not None:
        argv += ["--drain-grace", str(drain_grace_s)]
    if notice_script:
        argv += ["--preemption-notice-script", notice_script]
    if notice_interval_s is not None:
        argv += ["--notice-interval", str(notice_interval_s)]
    return argv + (["--from-launcher"] if remote else ["--from-launcher", "--die-with-parent"])


def ssh_command(host: str, options: SshOptions, remote: list[str], cwd: str) -> list[str]:
    """`ssh ... host 'cd CWD && exec REMOTE'`: never asks for a password, gives up on a host that
    does not answer within SSH_CONNECT_TIMEOUT_S, accepts a host key it has not seen (as horovodrun)."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    if options.port is not None:
        argv += ["-p", str(options.port)]
    if options.identity_file:
        argv += ["-i", options.identity_file, "-o", "IdentitiesOnly=yes"]
    argv += [*options.extra, "--", host]  # whatever the host's name, ssh reads it as a host, never an option
    return argv + [f"cd {shlex.quote(cwd)} && exec {' '.join(shlex.quote(a) for a in remote)}"]


def forwarded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What of the launching environment a remote agent (and so its workers) gets."""
    return {k: v for k, v in environ.items()
            if k not in NOT_FORWARDED and not k.startswith(NOT_FORWARDED_PREFIXES)}


def srun_command(host: str, agent: list[str], extra: tuple[str, ...] = ()) -> list[str]:
    """`srun` starting one agent on Slurm node `host` as a step of the job this process runs in
    (`--overlap`: it shares the allocation's CPUs with the other agents and the batch script;
    Slurm tracks it and kills it with the job). Its stdin is the agent's, as over ssh."""
    return ["srun", "--nodes=1", "--ntasks=1", "--overlap", f"--nodelist={host}", "--kill-on-bad-exit=0",
            "--job-name=ringmaster-agent", "--quiet", *extra, *agent]


def choose_launcher(flag: str | None, environ: Mapping[str, str]) -> str:
    """`--launcher`, else $RINGMASTER_LAUNCHER, else `slurm` inside a Slurm job, else ssh."""
    return flag or environ.get(LAUNCHER_ENV) or ("slurm" if environ.get("SLURM_JOB_ID") else DEFAULT_LAUNCHER)
