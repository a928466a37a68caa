"""A real Slurm for tests: `slurmctld` in the root namespace, one `slurmd` per network namespace.

Each node is a namespace of `netns.NetworkHosts` (its own address on a bridge) with its own host
name (a UTS namespace, `unshare --uts`): slurmd finds its node by its host name, and the jobs it
runs see that name, as on a real machine. One `munged` with a key made for the test signs
everything (its socket is named in slurm.conf). The configuration is the test's own: no
accounting database, `proctrack/linuxproc` and `task/none` (no cgroups needed), short timeouts.
`remove()` stops every daemon and removes the namespaces, whatever happened.

Needs root, iproute2's `ip`, util-linux's `unshare` and Debian's slurmctld, slurmd,
slurm-client and munge packages; `skip_reason()` says what is missing.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import time

from harness import free_port, wait_for
from netns import NetHost, NetworkHosts
from netns import skip_reason as netns_skip_reason

DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "srun", "scontrol", "scancel", "sinfo", "squeue")
CONTROLLER = "rmctl"


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None)


def skip_reason() -> str | None:
    """Why a Slurm cluster cannot be made here (None: it can)."""
    missing = [name for name in (*DAEMONS, *CLIENTS, "unshare") if _which(name) is None]
    if missing:
        return (f"{', '.join(missing)} missing (Debian packages slurmctld, slurmd, slurm-client, munge; .ci/setup "
                "installs them)")
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); CI runs as root"
    return netns_skip_reason(need_sshd=False)


class SlurmCluster:
    def __init__(self, nodes: int, workdir: pathlib.Path, cpus: int = 2) -> None:
        self.workdir = workdir
        self.net = NetworkHosts(nodes, workdir)
        self.names = [f"node{i}" for i in range(nodes)]
        self.cpus = cpus
        self.conf = workdir / "slurm.conf"
        self.munge_socket = workdir / "munge" / "munge.socket.2"
        self.munged: subprocess.Popen | None = None
        self.slurmctld: subprocess.Popen | None = None
        self.slurmds: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client (sbatch, scontrol) needs to find this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def node(self, name: str) -> NetHost:
        return self.net.hosts[self.names.index(name)]

    def start(self) -> "SlurmCluster":
        try:
            self.net.start(sshd=False)
            self._start_munge()
            self._write_conf()
            self._start_slurmctld()
            for name in self.names:
                self.start_slurmd(name)
            wait_for(lambda: self._idle() == set(self.names), 60, f"every node idle ({self._sinfo()})")
        except BaseException:
            self.remove()
            raise
        return self

    def _start_munge(self) -> None:
        folder = self.munge_socket.parent
        folder.mkdir(mode=0o700)
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munged = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
             f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for(lambda: self.munge_socket.exists() or self._died(self.munged, "munged"), 30, "munged's socket")

    def _write_conf(self) -> None:
        w = self.workdir
        (w / "ctld").mkdir()
        lines = [
            "ClusterName=rmtest", f"SlurmctldHost={CONTROLLER}({self.net.gateway})",
            f"SlurmctldPort={free_port('0.0.0.0')}", f"SlurmdPort={free_port('0.0.0.0')}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire: also how long a requeued job waits before it may start again (Slurm default 120 s)
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={w}/ctld", f"SlurmdSpoolDir={w}/slurmd-%n",
            f"SlurmctldPidFile={w}/slurmctld.pid", f"SlurmdPidFile={w}/slurmd-%n.pid",
            f"SlurmctldLogFile={w}/slurmctld.log", f"SlurmdLogFile={w}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MpiDefault=none",
            "SwitchType=switch/none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill", "ReturnToService=2", "JobRequeue=1",
            # Short timeouts: a dead node is DOWN in seconds, a requeued job starts again at once.
            "SlurmdTimeout=10", "SlurmctldTimeout=10", "MessageTimeout=5", "KillWait=5", "MinJobAge=300",
            "InactiveLimit=0", "WaitTime=0", "SchedulerParameters=sched_interval=1",
            "SlurmctldDebug=info", "SlurmdDebug=info",
        ]
        for name, host in zip(self.names, self.net.hosts):
            lines.append(f"NodeName={name} NodeAddr={host.address} CPUs={self.cpus} State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _start_slurmctld(self) -> None:
        self.slurmctld = subprocess.Popen(
            ["unshare", "--uts", "sh", "-c", f'hostname {CONTROLLER} && exec slurmctld -D -i -f "{self.conf}"'],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for(lambda: self._answers() or self._died(self.slurmctld, "slurmctld"), 60, "slurmctld to answer")

    def start_slurmd(self, name: str) -> None:
        """Start (or start again) the slurmd of node `name`, in its namespace, under its host name
        (`nsenter`, not `ip netns exec`, which mounts a sysfs of its own without the cgroup file systems)."""
        host = self.node(name)
        self.slurmds[name] = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{host.netns}", "unshare", "--uts", "sh", "-c",
             f'hostname {name} && exec slurmd -D -f "{self.conf}"'],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    def kill_node(self, name: str) -> int:
        """The node dies: every process in its namespace (slurmd, the job's steps, their agents
        and workers) SIGKILLed."""
        count = 0
        for _ in range(3):
            count += self.node(name).kill_all(keep_sshd=False)
        return count

    def _died(self, proc: subprocess.Popen | None, what: str) -> bool:
        if proc is not None and proc.poll() is not None:
            said = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            logs = "".join(
                f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.workdir.glob("*.log")
            )
            raise RuntimeError(f"{what} exited with code {proc.returncode}: {said}{logs}")
        return False

    def scontrol(self, *args: str) -> str:
        done = subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def _answers(self) -> bool:
        return subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True, text=True,
                              timeout=30).stdout.count("UP") > 0

    def _sinfo(self) -> str:
        return subprocess.run(["sinfo", "-N", "-h", "-o", "%N %t"], env=self.env, capture_output=True, text=True,
                              timeout=30).stdout.strip()

    def _idle(self) -> set[str]:
        for proc, what in [(self.slurmctld, "slurmctld"), *((p, f"slurmd of {n}") for n, p in self.slurmds.items())]:
            self._died(proc, what)
        return {line.split()[0] for line in self._sinfo().splitlines() if line.split()[1:] == ["idle"]}

    def node_states(self) -> dict[str, str]:
        return dict(line.split()[:2] for line in self._sinfo().splitlines() if len(line.split()) >= 2)

    def sbatch(self, script: pathlib.Path, *args: str) -> str:
        """Submit `script` (from the work folder); its job id."""
        done = subprocess.run(["sbatch", "--parsable", *args, str(script)], env=self.env, cwd=self.workdir,
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=self.env, capture_output=True, text=True,
                             timeout=30).stdout
        fields = dict(part.split("=", 1) for part in out.split() if "=" in part)
        return fields.get("JobState", "UNKNOWN")

    def job_field(self, job_id: str, name: str) -> str:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=self.env, capture_output=True, text=True,
                             timeout=30).stdout
        return dict(part.split("=", 1) for part in out.split() if "=" in part).get(name, "")

    def logs(self) -> str:
        return "".join(
            f"\n--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in sorted(self.workdir.glob("*.log"))
        )

    def remove(self) -> None:
        for job in subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True,
                                  timeout=30).stdout.split() if self.slurmctld is not None else []:
            subprocess.run(["scancel", job], env=self.env, capture_output=True, timeout=30)
        for proc in [*self.slurmds.values(), self.slurmctld, self.munged]:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in [*self.slurmds.values(), self.slurmctld, self.munged]:
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.net.remove()  # every process left in the namespaces (steps, agents, workers) is killed there
