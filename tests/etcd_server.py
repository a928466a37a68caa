"""A real etcd for tests: free loopback ports, a temporary data folder, its own process group.

`EtcdServer` is one member (a cluster of one by default); `EtcdCluster` is several members that
form one cluster, so a test can kill a member and see the others carry on.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import ssl
import subprocess
import urllib.request

from harness import free_port, wait_for
from tls_files import TlsFiles

ETCD = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)


class EtcdServer:
    def __init__(self, data_dir: pathlib.Path, name: str = "test", tls: "TlsFiles | None" = None) -> None:
        """With `tls`, clients speak TLS to it (its certificate signed by `tls.ca`)."""
        self.data_dir = data_dir
        self.name = name
        self.tls = tls
        self.client_port = free_port()
        self.peer_port = free_port()
        self.initial_cluster = f"{name}={self.peer_url}"
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.client_port)

    @property
    def address(self) -> str:
        """HOST:PORT of the client endpoint, as the store and its messages name it."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def launch(self) -> None:
        """Start the process without waiting (the members of a cluster wait for each other).
        Started again on the same folder it comes back with its data."""
        assert ETCD is not None
        client = f"{'https' if self.tls else 'http'}://{self.address}"
        tls = ["--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key)] \
            if self.tls else []
        self.proc = subprocess.Popen(
            [ETCD, "--name", self.name, "--data-dir", str(self.data_dir), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", self.peer_url,
             "--initial-advertise-peer-urls", self.peer_url, "--initial-cluster", self.initial_cluster,
             "--heartbeat-interval", "10", "--election-timeout", "100", *tls],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

    def start(self) -> "EtcdServer":
        self.launch()
        wait_for(self.healthy, 20, f"etcd on {self.address} to be healthy")
        return self

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"etcd exited with {self.proc.returncode}")
        try:
            if self.tls:
                context = ssl.create_default_context(cafile=str(self.tls.ca))
                with urllib.request.urlopen(f"https://{self.address}/health", timeout=1, context=context) as response:
                    return b'"health"' in response.read()
            with urllib.request.urlopen(f"http://{self.address}/health", timeout=1) as response:
                return b'"true"' in response.read()
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def is_raft_leader(self) -> bool:
        """Whether this member leads the cluster's raft (etcd's JSON gateway, maintenance status)."""
        request = urllib.request.Request(f"http://{self.address}/v3/maintenance/status", data=b"{}")
        with urllib.request.urlopen(request, timeout=2) as response:
            status = json.loads(response.read())
        return bool(status["leader"] == status["header"]["member_id"])


class EtcdCluster:
    """`size` members on loopback forming one cluster (quorum: a majority of them)."""

    def __init__(self, root: pathlib.Path, size: int = 3) -> None:
        self.members = [EtcdServer(root / f"member{i}", name=f"member{i}") for i in range(size)]
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.initial_cluster = cluster

    def raft_leader(self) -> EtcdServer:
        return next(m for m in self.members if m.proc is not None and m.proc.poll() is None and m.is_raft_leader())

    def start(self) -> "EtcdCluster":
        for member in self.members:
            member.launch()
        for member in self.members:
            wait_for(member.healthy, 30, f"etcd member {member.name} to join a healthy cluster")
        return self

    def kill(self) -> None:
        for member in self.members:
            member.kill()
