"""The rendezvous state store: what the rendezvous needs from etcd, as one small interface.

Two implementations: `MemoryStore` (the embedded default, one process) and `EtcdStore` (etcd's
v3 API: state that outlives the rendezvous process and can be shared by a standby). Values are
JSON objects, never pickles; every key of a job lives under the job's prefix; liveness comes
from leases that the store expires on its own clock; conditional writes compare a key's
`mod_revision` (0: the key must not exist); watches resume from a revision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol

from ringmaster.common.errors import StateError


@dataclass(frozen=True)
class Entry:
    key: str
    value: dict[str, Any]
    mod_revision: int


@dataclass(frozen=True)
class Change:
    """One watched change: `value` is None for a deletion (or a lease expiry)."""

    key: str
    value: dict[str, Any] | None
    revision: int


class StoreUnavailable(StateError):
    """The store cannot be reached; the message names the endpoints tried."""


class StoreAccessRefused(StateError):
    """The store answered but refused us (credentials, certificates); the message says which."""


class StoreFormatError(StateError):
    """A value under the job's prefix that this version cannot read (written by something else)."""


class RevisionCompacted(StateError):
    """A watch asked for history the store no longer keeps; read the current state again."""

    def __init__(self, compacted_revision: int) -> None:
        super().__init__(f"revisions below {compacted_revision} were compacted; re-read the state and watch from there")
        self.compacted_revision = compacted_revision


class KeyValueStore(Protocol):
    async def get_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        """Entries under `prefix` (sorted by key) and the store revision they were read at."""

    async def put(self, key: str, value: dict[str, Any], lease: int | None = None) -> int:
        """Write unconditionally; returns the new revision."""

    async def put_if(self, key: str, value: dict[str, Any], mod_revision: int, lease: int | None = None) -> bool:
        """Write only if `key`'s mod_revision is `mod_revision` (0: only if absent)."""

    async def delete(self, key: str) -> None: ...

    async def transact(self, guards: dict[str, int], puts: dict[str, dict[str, Any]], deletes: list[str],
                       lease: int | None = None) -> bool:
        """All of `puts` (attached to `lease`) and `deletes` at once, only if every key in
        `guards` has the given mod_revision (0: absent); False, changing nothing, otherwise."""

    async def grant_lease(self, ttl_s: int) -> int:
        """A lease that expires `ttl_s` seconds after its last refresh, with its keys."""

    async def refresh_lease(self, lease: int) -> bool:
        """Keep `lease` alive; False when it has already expired."""

    async def revoke_lease(self, lease: int) -> None: ...

    def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[Change]:
        """Changes under `prefix` from `start_revision` on (raises RevisionCompacted)."""

    async def close(self) -> None: ...


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def decode(key: str, raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise StoreFormatError(
            f"the value of {key!r} is not JSON; was this prefix written by something else?"
        ) from None
    if not isinstance(value, dict):
        raise StoreFormatError(f"the value of {key!r} is not a JSON object")
    return value
