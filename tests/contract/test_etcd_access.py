"""The store on an etcd that wants more than a plain connection: TLS and authentication.

A real etcd started for the test with TLS (certificates made in the test) and authentication
enabled through etcd's own API (a root user with a password)."""

from __future__ import annotations

import asyncio

import aetcd.rpc
import grpc
import pytest
from etcd_server import ETCD, EtcdServer
from tls_files import make_tls_files

from ringmaster.rendezvous.state.kv import StoreAccessRefused, StoreUnavailable
from ringmaster.rendezvous.state.open_store import open_store
from ringmaster.rendezvous.state.url import parse_store

PASSWORD = "s3cret:with@odd/chars"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _enable_auth(server: EtcdServer) -> None:
    channel = aetcd.rpc.secure_channel(server.address, grpc.ssl_channel_credentials(server.tls.ca.read_bytes()))
    auth = aetcd.rpc.AuthStub(channel)
    try:
        await auth.UserAdd(aetcd.rpc.AuthUserAddRequest(name="root", password=PASSWORD))
        await auth.RoleAdd(aetcd.rpc.AuthRoleAddRequest(name="root"))
        await auth.UserGrantRole(aetcd.rpc.AuthUserGrantRoleRequest(user="root", role="root"))
        await auth.AuthEnable(aetcd.rpc.AuthEnableRequest())
    finally:
        await channel.close()


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory):
    if ETCD is None:
        pytest.skip("the etcd binary is missing (Debian package etcd-server; .ci/run installs it)")
    folder = tmp_path_factory.mktemp("secure-etcd")
    server = EtcdServer(folder / "data", tls=make_tls_files(folder / "tls"))
    try:
        server.start()
        run(_enable_auth(server))
        yield server
    finally:
        server.kill()


def test_a_store_over_tls_with_a_password_keeps_the_job(secure_etcd) -> None:
    spec = parse_store(f"etcds://root@{secure_etcd.address}/secure/job", ca_file=str(secure_etcd.tls.ca),
                       password=PASSWORD)
    assert PASSWORD not in repr(spec) and PASSWORD not in spec.describe()
    assert spec.describe().endswith("over TLS as root under /secure/job/")

    async def body() -> None:
        store = await open_store(spec)
        try:
            await store.put("/secure/job/a", {"x": 1})
            entries, _ = await store.get_prefix("/secure/job/")
            assert [(e.key, e.value) for e in entries] == [("/secure/job/a", {"x": 1})]
        finally:
            await store.close()

    run(body())


@pytest.mark.parametrize("url, password, kind, message", [
    ("etcds://root@{a}/p", "wrong", StoreAccessRefused, "refused this store's access"),
    ("etcds://{a}/p", None, StoreAccessRefused, "refused this store's access"),
    ("etcd://root@{a}/p", PASSWORD, StoreUnavailable, "no etcd endpoint answered"),
])
def test_wrong_credentials_or_no_tls_are_named_without_the_password(secure_etcd, url, password, kind, message) -> None:
    spec = parse_store(url.format(a=secure_etcd.address),
                       ca_file=str(secure_etcd.tls.ca) if url.startswith("etcds") else None,
                       password=password)
    with pytest.raises(kind, match=message) as info:
        run(open_store(spec))
    assert PASSWORD not in str(info.value) and "wrong" not in str(info.value)


def test_a_certificate_from_another_ca_is_not_trusted(secure_etcd, tmp_path) -> None:
    other = make_tls_files(tmp_path / "other")
    spec = parse_store(f"etcds://root@{secure_etcd.address}/p", ca_file=str(other.ca), password=PASSWORD)
    with pytest.raises(StoreUnavailable):
        run(open_store(spec))
