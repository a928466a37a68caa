"""Hosts with their own network for tests: Linux network namespaces on a bridge, an sshd in each.

Each host is a namespace with one address on a bridge in the root namespace (where the
rendezvous runs, at the bridge's address), its own loopback, and an sshd listening on its
address that accepts a key made for the test. Nothing leaves the machine: the subnet is a
private /24 unused here, without a route out. `remove()` kills every process in the
namespaces (the kernel does not when a namespace is deleted) and deletes them and the bridge.

Needs root (CAP_NET_ADMIN), `ip` and Debian's openssh-server; `skip_reason()` says what is missing.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from harness import wait_for

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


def skip_reason(need_sshd: bool = True) -> str | None:
    """Why namespaces (with sshd unless told otherwise) cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); CI runs as root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    if need_sshd and SSHD is None:
        return "sshd is missing (Debian package openssh-server; .ci/setup installs it)"
    probe = f"rmprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


#: Where tests running side by side (pytest-xdist) reserve their subnets: the bridge's address
#: alone cannot say a subnet is taken (a test that cuts the rendezvous off removes it a while).
SUBNET_RESERVATIONS = pathlib.Path("/tmp/ringmaster-test-subnets")


def _owner_alive(reservation: pathlib.Path) -> bool:
    try:
        os.kill(int(reservation.read_text() or "0"), 0)
    except (ValueError, ProcessLookupError, FileNotFoundError):
        return False
    except PermissionError:
        return True
    return True


def _reserve_subnet() -> int:
    """A third octet n with 10.213.n.0/24 unused on this machine, reserved for this process
    (released by `_release_subnet`; a reservation whose process died is taken over)."""
    SUBNET_RESERVATIONS.mkdir(parents=True, exist_ok=True)
    used = _ip("-o", "-4", "addr").stdout
    for n in range(1, 250):
        if f"10.213.{n}." in used:
            continue
        reservation = SUBNET_RESERVATIONS / str(n)
        for _ in range(2):
            try:
                fd = os.open(reservation, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if _owner_alive(reservation):
                    break
                reservation.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as out:
                out.write(str(os.getpid()))
            return n
    raise RuntimeError("no free 10.213.x.0/24 subnet")


def _release_subnet(n: int) -> None:
    (SUBNET_RESERVATIONS / str(n)).unlink(missing_ok=True)


@dataclass
class NetHost:
    """One namespace: its name, address and sshd."""

    netns: str
    address: str
    veth: str
    sshd: subprocess.Popen | None = None

    def run(self, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], **kwargs)

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def pythons(self) -> list[int]:
        """Python processes in the namespace (its agent and workers)."""
        found = []
        for pid in self.pids():
            try:
                if b"python" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                continue
        return found

    def kill_all(self, sig: int = signal.SIGKILL, keep_sshd: bool = True) -> int:
        """Signal every process in the namespace (the host dies), its sshd spared unless told."""
        spared = {self.sshd.pid} if keep_sshd and self.sshd is not None else set()
        count = 0
        for pid in self.pids():
            if pid in spared:
                continue
            try:
                os.kill(pid, sig)
                count += 1
            except ProcessLookupError:
                pass
        return count

    def link(self, up: bool) -> None:
        """Cut or restore this host's link to the bridge (a partition)."""
        _ip("link", "set", self.veth, "up" if up else "down")


class NetworkHosts:
    def __init__(self, count: int, workdir: pathlib.Path) -> None:
        tag = f"{os.getpid() % 10000}{int(time.time() * 1000) % 100}"
        self.subnet = _reserve_subnet()
        self.bridge = f"rmb{tag}"[:15]
        self.gateway = f"10.213.{self.subnet}.1"
        self.workdir = workdir
        self.key = workdir / "id_ed25519"
        self.hosts = [NetHost(f"rmns{tag}h{i}", f"10.213.{self.subnet}.{10 + i}",
                              f"rmv{tag}{i}"[:15]) for i in range(count)]

    def start(self, sshd: bool = True) -> "NetworkHosts":
        """Make the namespaces (and start an sshd in each unless told not to)."""
        try:
            self._make_network()
            if sshd:
                self._start_sshds()
        except BaseException:
            self.remove()
            raise
        return self

    def _make_network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            _ip("netns", "add", host.netns)
            # Inside, the interface has the bridge's name: one name on every host, as --network-interface wants.
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", self.bridge, "netns", host.netns)
            _ip("link", "set", host.veth, "master", self.bridge)
            _ip("link", "set", host.veth, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", self.bridge)
            _ip("-n", host.netns, "link", "set", self.bridge, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")

    def _start_sshds(self) -> None:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        host_key = self.workdir / "host_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        authorized = self.workdir / "authorized_keys"
        authorized.write_text(pathlib.Path(f"{self.key}.pub").read_text())
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        for host in self.hosts:
            config = self.workdir / f"sshd_{host.address}.conf"
            config.write_text("\n".join([
                f"ListenAddress {host.address}", "Port 22", f"HostKey {host_key}",
                f"AuthorizedKeysFile {authorized}", f"PidFile {self.workdir}/sshd_{host.address}.pid",
                "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "UsePAM no", "StrictModes no", "LogLevel ERROR", "MaxStartups 100", "",
            ]))
            host.sshd = subprocess.Popen(["ip", "netns", "exec", host.netns, SSHD, "-D", "-e", "-f", str(config)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for host in self.hosts:
            wait_for(lambda: self._listening(host), 30, f"sshd in {host.netns} to listen on {host.address}:22")

    @staticmethod
    def _listening(host: NetHost) -> bool:
        if host.sshd is not None and host.sshd.poll() is not None:
            raise RuntimeError(f"sshd in {host.netns} exited: "
                               f"{host.sshd.stderr.read().decode() if host.sshd.stderr else ''}")
        return f"{host.address}:22" in host.run("ss", "-ltn", capture_output=True, text=True).stdout

    def cut_rendezvous(self, cut: bool) -> None:
        """Cut the root namespace (the rendezvous) off from every host, or heal it: its address
        leaves the bridge, so nothing reaches it while the hosts still reach each other."""
        _ip("addr", "del" if cut else "add", f"{self.gateway}/24", "dev", self.bridge)

    def ssh_env(self) -> dict[str, str]:
        """What `ringmaster run` needs to reach these hosts: the key's options, no known_hosts kept."""
        return {"RINGMASTER_SSH_OPTIONS": "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"}

    def remove(self) -> None:
        for host in self.hosts:
            for _ in range(3):  # processes started while killing (a worker's children) are caught next round
                if not host.kill_all(keep_sshd=False):
                    break
            if host.sshd is not None:
                try:
                    host.sshd.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            _ip("netns", "del", host.netns, check=False)
            _ip("link", "del", host.veth, check=False)
        _ip("link", "del", self.bridge, check=False)
        _release_subnet(self.subnet)
