"""Open the store a `StoreSpec` names: the in-memory one, or etcd (first endpoint that answers)."""

from __future__ import annotations

import logging

from ringmaster.common.events import log_event
from ringmaster.common.logs import STORE
from ringmaster.rendezvous.state.kv import KeyValueStore
from ringmaster.rendezvous.state.memory_kv import MemoryStore
from ringmaster.rendezvous.state.url import StoreSpec


async def open_store(spec: StoreSpec) -> KeyValueStore:
    """Raises kv.StoreUnavailable naming every endpoint tried. Moves from an etcd endpoint that
    stopped answering to the next one are logged (`ringmaster.store`)."""
    if spec.kind == "memory":
        return MemoryStore()
    from ringmaster.rendezvous.state.etcd_kv import EtcdStore  # only etcd users pay for its client

    store_log = logging.getLogger(STORE)
    return await EtcdStore.connect(list(spec.endpoints), log=lambda event: log_event(store_log, event),
                                   access=spec.access)
