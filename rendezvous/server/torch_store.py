"""The torch.distributed stores the rendezvous owns.

One long-lived TCPStore serves every elastic ring rebuild: each generation uses its own key
prefix, so a rebuild never reads a stale key and costs milliseconds instead of a new server.
Plain scripts (torchrun contract, TORCHELASTIC_USE_AGENT_STORE) key their rendezvous without a
prefix, so each planned generation of theirs gets a fresh store; the last few are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import timedelta

import torch.distributed as dist

#: Planned-generation stores kept alive (older ones are closed).
KEEP_PLAIN_STORES = 2


class TorchStoreHost:
    """The TCPStores the rings meet on (torch.distributed's, not the rendezvous' state store)."""

    def __init__(self, host: str = "127.0.0.1", timeout_s: float = 300.0) -> None:
        self.host = host
        self._timeout = timedelta(seconds=timeout_s)
        self.tcp_store = self._serve()
        self.port = self.tcp_store.port
        self._plain: OrderedDict[int, dist.TCPStore] = OrderedDict()

    def _serve(self) -> dist.TCPStore:
        return dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False, timeout=self._timeout)

    def plain_store(self, generation: int) -> tuple[str, int]:
        """A fresh store for the plain workers of `generation`."""
        store = self._serve()
        self._plain[generation] = store
        while len(self._plain) > KEEP_PLAIN_STORES:
            self._plain.popitem(last=False)
        return self.host, store.port
