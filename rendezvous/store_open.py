"""Open the store a `StoreSpec` names: the in-memory one, or etcd (first endpoint that answers)."""

from __future__ import annotations

from typing import Callable

from rendezvous.kv_store import KeyValueStore
from rendezvous.memory_kv import MemoryStore
from rendezvous.store_url import StoreSpec


async def open_store(spec: StoreSpec, log: Callable[[str], None] | None = None) -> KeyValueStore:
    """Raises kv_store.StoreUnavailable naming every endpoint tried. `log` hears of moves from an
    etcd endpoint that stopped answering to the next one."""
    if spec.kind == "memory":
        return MemoryStore()
    from rendezvous.etcd_kv import EtcdStore  # only etcd users pay for its client

    return await EtcdStore.connect(list(spec.endpoints), log=log)
