"""`--store memory` or `--store etcd[s]://[USER@]HOST:PORT[,HOST:PORT...][/PREFIX]`, parsed and checked.

`etcds://` speaks TLS to etcd (its CA, and a client certificate if etcd asks for one, come from
`--store-ca`, `--store-cert`, `--store-key`); `USER@` logs in to an etcd with authentication
enabled (percent-encode `@`, `:` or `/` in it), with the password from `--store-password-file`
or `$RINGMASTER_STORE_PASSWORD`: a password in the URL would sit in the process' command line,
which every user of the machine can read (/proc/PID/cmdline), so it is refused. The password is
never printed.

Pure: the store is opened elsewhere (`rendezvous/state/open_store.py`). A job keeps every key under
its prefix, so two jobs on one etcd are kept apart by giving them different prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote

from ringmaster.common.errors import UsageError

#: The prefix of a job's keys when --store names none.
DEFAULT_PREFIX = "/ringmaster/default/"
#: Environment variable with the password of the store's USER (or --store-password-file).
STORE_PASSWORD_ENV = "RINGMASTER_STORE_PASSWORD"


class StoreUrlError(UsageError, ValueError):
    """A --store value that cannot be used; the message shows the expected form."""


@dataclass(frozen=True)
class EtcdAccess:
    """How to reach an etcd that wants more than a plain connection."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True)
class StoreSpec:
    kind: str  # "memory" or "etcd"
    endpoints: tuple[tuple[str, int], ...] = ()
    prefix: str = DEFAULT_PREFIX
    access: EtcdAccess = EtcdAccess()

    def describe(self) -> str:
        if self.kind == "memory":
            return "memory (state lives in this process)"
        how = (" over TLS" if self.access.tls else "") + (f" as {self.access.username}" if self.access.username else "")
        return f"etcd at {','.join(f'{h}:{p}' for h, p in self.endpoints)}{how} under {self.prefix}"


_FORM = "expected 'memory' or 'etcd[s]://[USER@]HOST:PORT[,HOST:PORT...][/PREFIX]'"


def parse_store(value: str, ca_file: str | None = None, cert_file: str | None = None,
                key_file: str | None = None, password: str | None = None) -> StoreSpec:
    """The store `value` names, logging in as its USER with `password` (read by the caller from
    --store-password-file or the environment); error messages never repeat a password."""
    text = value.strip()
    if text == "memory":
        return StoreSpec("memory")
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("etcd", "etcds"):
        raise StoreUrlError(f"--store {_shown(value)!r}: {_FORM}")
    authority = rest.partition("/")[0]
    userinfo, at, _ = authority.rpartition("@")
    rest = rest[len(userinfo) + 1:] if at else rest
    username = None
    if at:
        user, colon, _ = userinfo.partition(":")
        if colon:
            raise StoreUrlError(
                f"--store {_shown(value)!r}: a password in the URL can be read by every user of this machine (in the "
                f"command line); write etcd://{user}@... and give the password in --store-password-file FILE (mode "
                f"600) or ${STORE_PASSWORD_ENV}")
        if not user:
            raise StoreUrlError(f"--store {_shown(value)!r}: write the user before '@' (etcd://USER@HOST:PORT)")
        username = unquote(user)
        if not password:
            raise StoreUrlError(f"--store {_shown(value)!r}: etcd user {username!r} needs a password: give "
                                f"--store-password-file FILE (mode 600) or ${STORE_PASSWORD_ENV}")
    elif password:
        raise StoreUrlError(f"--store {_shown(value)!r}: a store password is given but no user: write etcd://USER@...")
    tls = scheme == "etcds"
    if not tls and (ca_file or cert_file or key_file):
        raise StoreUrlError("--store-ca, --store-cert and --store-key are for TLS: write the store as etcds://...")
    if bool(cert_file) != bool(key_file):
        raise StoreUrlError("--store-cert and --store-key go together (a client certificate and its key)")
    access = EtcdAccess(username, password, tls, ca_file, cert_file, key_file)
    hosts, _, prefix = rest.partition("/")
    endpoints = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StoreUrlError(f"--store {_shown(value)!r}: endpoint {item!r} is not HOST:PORT; {_FORM}")
        endpoints.append((host, int(port)))
    prefix = prefix.strip("/")
    if any(not part for part in prefix.split("/")) and prefix:
        raise StoreUrlError(f"--store {_shown(value)!r}: the prefix {prefix!r} has an empty part; {_FORM}")
    return StoreSpec("etcd", tuple(endpoints), f"/{prefix}/" if prefix else DEFAULT_PREFIX, access)


def _shown(value: str) -> str:
    """`value` with the password of its credentials, if any, hidden."""
    scheme, sep, rest = value.partition("://")
    userinfo, at, hosts = rest.partition("@")
    if not sep or not at or ":" not in userinfo:
        return value
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{hosts}"
