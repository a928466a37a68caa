"""The store in etcd, through the v3 API (the `aetcd` client: grpcio + current protobuf).

An etcd cluster is only highly available to a client that can leave a dead member: the store
talks to one endpoint at a time and, when a request to it fails to connect or times out, moves
to the next endpoint of the list and sends the request again there. `StoreUnavailable` (naming
every endpoint tried) is raised only when no endpoint answers. A request sent again is safe:
puts and deletes are idempotent, a guarded transaction that did apply fails its guard the second
time (its caller then reads the store), and a lease granted twice expires unused.

Keys and values are UTF-8 / JSON; a lease's keys are deleted by etcd itself when the lease
expires on etcd's clock, and leases are the cluster's, so they survive the move to another member.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.watcher
import grpc

from ringmaster.common.events import Event, Kind
from ringmaster.rendezvous.state.kv import (
    Change,
    Entry,
    RevisionCompacted,
    StoreAccessRefused,
    StoreFormatError,
    StoreUnavailable,
    decode,
    encode,
)
from ringmaster.rendezvous.state.url import EtcdAccess

T = TypeVar("T")

#: Seconds one etcd request may take before the endpoint counts as unreachable. Shorter than the
#: rendezvous' leader lease (3 s): a lease refresh lost in an etcd election (it times out, it does
#: not fail) is sent again to another member before the lease runs out.
DEFAULT_REQUEST_TIMEOUT_S = 2
#: Failures that say "this endpoint cannot serve us now" (not "the request was wrong").
_UNREACHABLE = (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError,
                aetcd.exceptions.InternalError)


#: Answers that say "these credentials or this certificate are not welcome" (retrying cannot help).
_REFUSED = (aetcd.exceptions.UnauthenticatedError, aetcd.exceptions.InvalidArgumentError)


class _TlsClient(aetcd.Client):
    """aetcd's client on a TLS channel (aetcd itself only opens plain ones). `connect` is
    aetcd's own, step for step, but for the channel."""

    def __init__(self, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:  # type: ignore[override]
        try:
            await self._connect_tls()
        except aetcd.rpc.AioRpcError as exc:
            aetcd.exceptions._handle_exception(exc)

    async def _connect_tls(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]  # aetcd's attribute, set in its __init__
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = aetcd.rpc.secure_channel(target, self._credentials, options=self._options.items())
            if self._username is not None and self._password is not None:
                self.auth_stub = aetcd.rpc.AuthStub(self.channel)
                request = aetcd.rpc.AuthenticateRequest(name=self._username, password=self._password)
                response = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                self.metadata = (("token", response.token),)
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(aetcd.rpc.WatchStub(self.channel), timeout=self._timeout,
                                                  metadata=self.metadata)
            self._connected.set()
        finally:
            self._is_connecting = False


def _read(path: str | None, what: str, private: bool = False) -> bytes | None:
    """A certificate's or (`private`) a key's bytes; a key that other users may read is refused."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
            mode = os.fstat(f.fileno()).st_mode
    except OSError as exc:
        raise StoreAccessRefused(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if private and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise StoreAccessRefused(
            f"{what} {path} can be read by other users (mode {stat.S_IMODE(mode):o}); chmod 600 it"
        )
    return data


def tls_credentials(access: EtcdAccess) -> grpc.ChannelCredentials:
    """The TLS credentials `access` names (the system's CAs without --store-ca)."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(access.ca_file, "--store-ca"),
        private_key=_read(access.key_file, "--store-key", private=True),
        certificate_chain=_read(access.cert_file, "--store-cert"),
    )


def _lease_gone(exc: Exception) -> bool:
    return "lease not found" in str(exc)


def _name(endpoint: tuple[str, int]) -> str:
    return f"{endpoint[0]}:{endpoint[1]}"


def _closed_under_us(client: aetcd.Client, current: aetcd.Client) -> bool:
    """Whether a CancelledError is the close of a client the store has left (closing a channel
    cancels its calls), not a cancellation of the task that made the call."""
    task = asyncio.current_task()
    return client is not current and task is not None and task.cancelling() == 0


class EtcdStore:
    def __init__(self, endpoints: list[tuple[str, int]], timeout_s: int = DEFAULT_REQUEST_TIMEOUT_S,
                 log: Callable[[Event], None] | None = None, access: EtcdAccess = EtcdAccess()) -> None:
        if not endpoints:
            raise ValueError("an etcd store needs at least one endpoint")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self.access = access
        self._credentials = tls_credentials(access) if access.tls else None
        self.log = log
        self._index = 0
        self._client = self._new_client()
        self._closing: set[asyncio.Task] = set()  # clients left behind, being closed
        self.unreadable = 0  # keys skipped because they or their values do not decode

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now."""
        return _name(self.endpoints[self._index])

    @classmethod
    async def connect(cls, endpoints: list[tuple[str, int]], timeout_s: int = DEFAULT_REQUEST_TIMEOUT_S,
                      log: Callable[[Event], None] | None = None, access: EtcdAccess = EtcdAccess()) -> "EtcdStore":
        """A store on the first endpoint that answers a status request; StoreUnavailable naming
        every endpoint tried when none does, StoreAccessRefused when etcd refuses the credentials."""
        store = cls(endpoints, timeout_s, access=access)
        await store._request(lambda client: client.status())
        await store._request(lambda client: client.get(b"/"))  # a read: what etcd's authentication guards
        store.log = log  # from here on: endpoints skipped while connecting are not news
        return store

    # ------------------------------------------------------------ endpoints
    def _new_client(self) -> aetcd.Client:
        host, port = self.endpoints[self._index]
        login = {"username": self.access.username, "password": self.access.password}
        if self._credentials is not None:
            return _TlsClient(self._credentials, host=host, port=port, timeout=self.timeout_s, **login)
        return aetcd.Client(host=host, port=port, timeout=self.timeout_s, **login)

    def _move_on(self, failed: aetcd.Client, why: str) -> None:
        """Leave the endpoint whose client failed for the next one. Requests that were in flight
        on the same client fail too; only the first of them moves the store along."""
        if failed is not self._client:
            return
        left = self.endpoint
        self._index = (self._index + 1) % len(self.endpoints)
        self._client = self._new_client()
        closing = asyncio.get_running_loop().create_task(self._close_quietly(failed))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        if self.log is not None and len(self.endpoints) > 1:
            self.log(Event(Kind.STORE_FAILOVER, {"previous": left, "error": why, "endpoint": self.endpoint}))

    @staticmethod
    async def _close_quietly(client: aetcd.Client) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), DEFAULT_REQUEST_TIMEOUT_S)

    async def _request(self, send: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        """`send` to the current endpoint, and on to the others while they fail to answer."""
        failures: list[str] = []
        while len(failures) < len(self.endpoints):
            client, endpoint = self._client, self.endpoint
            try:
                return await send(client)
            except _REFUSED as exc:
                if not any(word in str(exc) for word in ("authentication", "token", "permission", "user name")):
                    raise
                raise StoreAccessRefused(
                    f"etcd at {endpoint} refused this store's access: {exc}; check the user and password in --store "
                    "(etcd[s]://USER@... with --store-password-file) and that the user's role covers the prefix"
                ) from None
            except (*_UNREACHABLE, OSError) as exc:
                failures.append(f"{endpoint} ({type(exc).__name__})")
                self._move_on(client, type(exc).__name__)
            except asyncio.CancelledError:
                if not _closed_under_us(client, self._client):
                    raise
                # Another request left this endpoint and closed its client: send again.
        raise StoreUnavailable(f"no etcd endpoint answered: tried {', '.join(failures)}; is etcd running there?")

    # ------------------------------------------------------------ keys
    async def get_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        result = await self._request(lambda c: c.get_prefix(prefix.encode()))
        entries = []
        for kv in result.kvs:
            read = self._read(kv.key, kv.value)
            if read is not None:
                entries.append(Entry(read[0], read[1], kv.mod_revision))
        return sorted(entries, key=lambda e: e.key), result.header.revision

    def _read(self, raw_key: bytes, raw_value: bytes) -> tuple[str, dict[str, Any]] | None:
        """(key, value), or None for a key or value that does not decode: the store is input like
        any other (anyone with access to etcd may write under the prefix), so such an entry is
        said, counted and skipped, and never stops a reader or a watch."""
        try:
            key = raw_key.decode()
            return key, decode(key, raw_value)
        except (UnicodeDecodeError, StoreFormatError) as exc:
            self.unreadable += 1
            if self.log is not None:
                shown = raw_key.decode(errors="replace")[:200]
                self.log(Event(Kind.STORE_UNREADABLE, {"key": shown, "error": str(exc)[:300],
                                                       "count": self.unreadable}))
            return None

    async def put(self, key: str, value: dict[str, Any], lease: int | None = None) -> int:
        result = await self._request(lambda c: c.put(key.encode(), encode(value), lease=lease))
        return result.header.revision

    async def put_if(self, key: str, value: dict[str, Any], mod_revision: int, lease: int | None = None) -> bool:
        return await self.transact({key: mod_revision}, {key: value}, [], lease=lease)

    async def transact(self, guards: dict[str, int], puts: dict[str, dict[str, Any]], deletes: list[str],
                       lease: int | None = None) -> bool:
        def send(client: aetcd.Client) -> Awaitable[tuple[bool, Any]]:
            tx = client.transactions
            return client.transaction(
                compare=[tx.mod(key.encode()) == revision for key, revision in guards.items()],
                success=[tx.put(key.encode(), encode(value), lease=lease) for key, value in puts.items()]
                + [tx.delete(key.encode()) for key in deletes],
                failure=[],
            )
        succeeded, _ = await self._request(send)
        return bool(succeeded)

    async def delete(self, key: str) -> None:
        await self._request(lambda c: c.delete(key.encode()))

    # ------------------------------------------------------------ leases
    async def grant_lease(self, ttl_s: int) -> int:
        lease = await self._request(lambda c: c.lease(ttl_s))
        return int(lease.id)

    async def refresh_lease(self, lease: int) -> bool:
        try:
            reply = await self._request(lambda c: c.refresh_lease(lease))
        except aetcd.exceptions.ClientError as exc:
            if _lease_gone(exc):
                return False  # it expired (its holder did not refresh it in time)
            raise
        return reply is not None and reply.TTL > 0

    async def revoke_lease(self, lease: int) -> None:
        try:
            await self._request(lambda c: c.revoke_lease(lease))
        except aetcd.exceptions.ClientError as exc:
            if not _lease_gone(exc):
                raise  # an expired lease is revoked already

    # ------------------------------------------------------------ watches
    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[Change]:
        """Changes from the current endpoint. When it fails the watch ends with StoreUnavailable
        and the store has moved on: watching again from the next revision resumes elsewhere."""
        client, endpoint = self._client, self.endpoint
        try:
            watch = await client.watch_prefix(prefix.encode(), start_revision=start_revision)
            async for event in watch:
                if event.kind == "DELETE":
                    key = event.kv.key.decode(errors="replace")
                    yield Change(key, None, event.kv.mod_revision)
                    continue
                read = self._read(event.kv.key, event.kv.value)
                if read is not None:
                    yield Change(read[0], read[1], event.kv.mod_revision)
        except aetcd.exceptions.RevisionCompactedError as exc:
            raise RevisionCompacted(exc.compacted_revision) from None
        except (*_UNREACHABLE, OSError) as exc:
            self._move_on(client, type(exc).__name__)
            raise StoreUnavailable(f"etcd at {endpoint} did not answer ({type(exc).__name__})") from None
        except asyncio.CancelledError:
            if not _closed_under_us(client, self._client):
                raise
            raise StoreUnavailable(f"left etcd at {endpoint} for {self.endpoint}; watch again") from None

    async def compact(self, revision: int) -> None:
        await self._request(lambda c: c.compact(revision))

    async def close(self) -> None:
        await asyncio.gather(*self._closing)
        await self._client.close()
