"""Open the store a `StoreSpec` names: the in-memory one, or etcd (first endpoint that answers)."""

from __future__ import annotations

from rendezvous.kv_store import KeyValueStore
from rendezvous.memory_kv import MemoryStore
from rendezvous.store_url import StoreSpec


async def open_store(spec: StoreSpec) -> KeyValueStore:
    """Raises kv_store.StoreUnavailable naming every endpoint tried."""
    if spec.kind == "memory":
        return MemoryStore()
    from rendezvous.etcd_kv import EtcdStore  # only etcd users pay for its client

    return await EtcdStore.connect(list(spec.endpoints))
