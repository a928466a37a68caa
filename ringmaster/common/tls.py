"""Optional TLS for the rendezvous' gRPC and HTTP: its certificate, and the CA its callers trust.

The rendezvous serves with `--tls-cert`/`--tls-key`; agents, workers and `ringmaster scale` check
its certificate against `--tls-ca` (agents and workers get the CA's PEM itself, in their
environment or the launcher's handover, so no file needs to exist on a remote host). Who may
call is the keys' business (`keys`, `seal`); TLS keeps what the calls carry (command lines,
environments) from being read on the way. The rings' own traffic (torch's TCPStore,
Gloo) has no TLS: keep the hosts on a network you trust.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import grpc

from ringmaster.common.errors import UsageError

#: Environment variable carrying the CA's PEM (not a path) to agents and workers.
TLS_CA_ENV = "RINGMASTER_TLS_CA_PEM"
#: Largest certificate or key file read.
MAX_PEM_BYTES = 1 << 20


class TlsError(UsageError):
    """A certificate, key or CA file that cannot be used; the message names the flag and file."""


def read_pem(path: str, flag: str, private: bool = False) -> bytes:
    """A PEM file's bytes; a `private` one (a key) is refused when other users may read it."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PEM_BYTES + 1)
            mode = os.fstat(f.fileno()).st_mode
    except OSError as exc:
        raise TlsError(f"{flag} {path}: {exc.strerror or exc}") from None
    if private and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TlsError(f"{flag} {path} can be read by other users (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    if len(data) > MAX_PEM_BYTES or b"-----BEGIN " not in data:
        raise TlsError(f"{flag} {path} is not a PEM file (it should start with '-----BEGIN ...')")
    return data


@dataclass(frozen=True)
class ServerTls:
    """The rendezvous' certificate and key (PEM), and the files they came from (uvicorn reads files)."""

    cert: bytes
    key: bytes
    cert_file: str
    key_file: str

    @classmethod
    def from_files(cls, cert_file: str | None, key_file: str | None) -> "ServerTls | None":
        if not cert_file and not key_file:
            return None
        if not cert_file or not key_file:
            raise TlsError("--tls-cert and --tls-key go together: the rendezvous' certificate and its key")
        return cls(read_pem(cert_file, "--tls-cert"), read_pem(key_file,
                                                               "--tls-key", private=True), cert_file, key_file)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)])


#: Each channel connects on its own. In grpc's default (shared) subchannel pool a new channel to
#: an address shares the connection of an older channel to it, and with it that connection's
#: backoff: a client that lost the rendezvous, still calling on its old channel, dialed a new one
#: that tried again only when the old one's backoff (growing 1.6-fold from 1 s) said so, up to
#: 5 s after the rendezvous was back, measured; a rendezvous that took over counted the silence
#: of workers that had not reconnected yet as death.
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


def channel(address: str, ca_pem: bytes | None) -> grpc.Channel:
    """A channel to `address`: TLS checked against `ca_pem` when given, plain otherwise; its own
    connection (`CHANNEL_OPTIONS`), which tries at once."""
    if ca_pem is None:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca_pem), options=CHANNEL_OPTIONS)
