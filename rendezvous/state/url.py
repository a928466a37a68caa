"""`--store memory` or `--store etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`, parsed and checked.

Pure: the store is opened elsewhere (`rendezvous/state/open_store.py`). A job keeps every key under
its prefix, so two jobs on one etcd are kept apart by giving them different prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringmaster.common.errors import UsageError

#: The prefix of a job's keys when --store names none.
DEFAULT_PREFIX = "/ringmaster/default/"


class StoreUrlError(UsageError, ValueError):
    """A --store value that cannot be used; the message shows the expected form."""


@dataclass(frozen=True)
class StoreSpec:
    kind: str  # "memory" or "etcd"
    endpoints: tuple[tuple[str, int], ...] = ()
    prefix: str = DEFAULT_PREFIX

    def describe(self) -> str:
        if self.kind == "memory":
            return "memory (state lives in this process)"
        return f"etcd at {','.join(f'{h}:{p}' for h, p in self.endpoints)} under {self.prefix}"


_FORM = "expected 'memory' or 'etcd://HOST:PORT[,HOST:PORT...][/PREFIX]'"


def parse_store(value: str) -> StoreSpec:
    text = value.strip()
    if text == "memory":
        return StoreSpec("memory")
    if not text.startswith("etcd://"):
        raise StoreUrlError(f"--store {value!r}: {_FORM}")
    rest = text.removeprefix("etcd://")
    hosts, _, prefix = rest.partition("/")
    endpoints = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StoreUrlError(f"--store {value!r}: endpoint {item!r} is not HOST:PORT; {_FORM}")
        endpoints.append((host, int(port)))
    prefix = prefix.strip("/")
    if any(not part for part in prefix.split("/")) and prefix:
        raise StoreUrlError(f"--store {value!r}: the prefix {prefix!r} has an empty part; {_FORM}")
    return StoreSpec("etcd", tuple(endpoints), f"/{prefix}/" if prefix else DEFAULT_PREFIX)
