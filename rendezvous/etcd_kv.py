"""The store in etcd, through the v3 API (the `aetcd` client: grpcio + current protobuf).

One client per endpoint is tried in order until one answers; an endpoint list that nobody
answers is reported by name. Keys and values are UTF-8 / JSON; a lease's keys are deleted by
etcd itself when the lease expires on etcd's clock.
"""

from __future__ import annotations

import functools
from typing import Any, AsyncIterator, Callable, Coroutine, ParamSpec, TypeVar

import aetcd
import aetcd.exceptions

from rendezvous.kv_store import Change, Entry, RevisionCompacted, StoreUnavailable, decode, encode

T = TypeVar("T")
P = ParamSpec("P")

#: Seconds one etcd request may take before the endpoint counts as unreachable.
DEFAULT_REQUEST_TIMEOUT_S = 5


def _unavailable_on_failure(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """A request that cannot reach etcd raises StoreUnavailable naming the endpoint, so callers
    handle one exception whichever store they have."""
    @functools.wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError,
                aetcd.exceptions.InternalError) as exc:
            endpoint = getattr(args[0], "endpoint", "?")
            raise StoreUnavailable(f"etcd at {endpoint} did not answer ({type(exc).__name__})") from None
    return wrapper


class EtcdStore:
    def __init__(self, client: aetcd.Client, endpoint: str) -> None:
        self._client = client
        self.endpoint = endpoint

    @classmethod
    async def connect(cls, endpoints: list[tuple[str, int]], timeout_s: int = DEFAULT_REQUEST_TIMEOUT_S) -> "EtcdStore":
        """The first endpoint that answers a status request; StoreUnavailable naming all tried."""
        failures = []
        for host, port in endpoints:
            client = aetcd.Client(host=host, port=port, timeout=timeout_s)
            try:
                await client.status()
            except (aetcd.exceptions.ClientError, OSError) as exc:
                failures.append(f"{host}:{port} ({type(exc).__name__})")
                await client.close()
                continue
            return cls(client, f"{host}:{port}")
        raise StoreUnavailable(f"no etcd endpoint answered: tried {', '.join(failures)}; is etcd running there?")

    @_unavailable_on_failure
    async def get_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        result = await self._client.get_prefix(prefix.encode())
        entries = [Entry(kv.key.decode(), decode(kv.key.decode(), kv.value), kv.mod_revision) for kv in result.kvs]
        return sorted(entries, key=lambda e: e.key), result.header.revision

    @_unavailable_on_failure
    async def put(self, key: str, value: dict[str, Any], lease: int | None = None) -> int:
        result = await self._client.put(key.encode(), encode(value), lease=lease)
        return result.header.revision

    @_unavailable_on_failure
    async def put_if(self, key: str, value: dict[str, Any], mod_revision: int, lease: int | None = None) -> bool:
        tx = self._client.transactions
        succeeded, _ = await self._client.transaction(
            compare=[tx.mod(key.encode()) == mod_revision],
            success=[tx.put(key.encode(), encode(value), lease=lease)],
            failure=[],
        )
        return bool(succeeded)

    @_unavailable_on_failure
    async def transact(self, guards: dict[str, int], puts: dict[str, dict[str, Any]], deletes: list[str],
                       lease: int | None = None) -> bool:
        tx = self._client.transactions
        succeeded, _ = await self._client.transaction(
            compare=[tx.mod(key.encode()) == revision for key, revision in guards.items()],
            success=[tx.put(key.encode(), encode(value), lease=lease) for key, value in puts.items()]
            + [tx.delete(key.encode()) for key in deletes],
            failure=[],
        )
        return bool(succeeded)

    @_unavailable_on_failure
    async def delete(self, key: str) -> None:
        await self._client.delete(key.encode())

    @_unavailable_on_failure
    async def grant_lease(self, ttl_s: int) -> int:
        lease = await self._client.lease(ttl_s)
        return int(lease.id)

    @_unavailable_on_failure
    async def refresh_lease(self, lease: int) -> bool:
        reply = await self._client.refresh_lease(lease)
        return reply is not None and reply.TTL > 0

    @_unavailable_on_failure
    async def revoke_lease(self, lease: int) -> None:
        await self._client.revoke_lease(lease)

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[Change]:
        try:
            watch = await self._client.watch_prefix(prefix.encode(), start_revision=start_revision)
            async for event in watch:
                key = event.kv.key.decode()
                value = None if event.kind == "DELETE" else decode(key, event.kv.value)
                yield Change(key, value, event.kv.mod_revision)
        except aetcd.exceptions.RevisionCompactedError as exc:
            raise RevisionCompacted(exc.compacted_revision) from None
        except (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError,
                aetcd.exceptions.InternalError) as exc:
            raise StoreUnavailable(f"etcd at {self.endpoint} did not answer ({type(exc).__name__})") from None

    @_unavailable_on_failure
    async def compact(self, revision: int) -> None:
        await self._client.compact(revision)

    async def close(self) -> None:
        await self._client.close()
