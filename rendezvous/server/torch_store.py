"""The torch.distributed stores the rendezvous owns.

One long-lived TCPStore serves every elastic ring rebuild: each generation uses its own key
prefix, so a rebuild never reads a stale key and costs milliseconds instead of a new server.
Plain scripts (torchrun contract, TORCHELASTIC_USE_AGENT_STORE) key their rendezvous without a
prefix, so each planned generation of theirs gets a fresh store; the last few are kept.
"""

from __future__ import annotations

import socket
from collections import OrderedDict
from datetime import timedelta

import torch.distributed as dist

#: Connections a store's listening socket queues (a ring of thousands connects at once).
LISTEN_BACKLOG = 4096
#: Planned-generation stores kept alive (older ones are closed).
KEEP_PLAIN_STORES = 2


class TorchStoreHost:
    """The TCPStores the rings meet on (torch.distributed's, not the rendezvous' state store).

    A TCPStore server listens on every interface by itself; each of ours is handed a socket
    bound to the rendezvous' `bind` address instead, so `--bind 127.0.0.1` keeps it on this
    machine. Workers are told `advertise`, the name other hosts dial."""

    def __init__(self, bind: str = "127.0.0.1", advertise: str | None = None, timeout_s: float = 300.0) -> None:
        self.bind = bind
        self.host = advertise or bind
        self._timeout = timedelta(seconds=timeout_s)
        self.tcp_store = self._serve()
        self.port = self.tcp_store.port
        self._plain: OrderedDict[int, dist.TCPStore] = OrderedDict()

    def _serve(self) -> dist.TCPStore:
        listener = socket.create_server((self.bind, 0), backlog=LISTEN_BACKLOG)
        try:
            return dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False, timeout=self._timeout,
                                 master_listen_fd=listener.fileno())
        finally:
            listener.detach()  # the store owns the descriptor now (and closes it)

    def plain_store(self, generation: int) -> tuple[str, int]:
        """A fresh store for the plain workers of `generation`."""
        store = self._serve()
        self._plain[generation] = store
        while len(self._plain) > KEEP_PLAIN_STORES:
            self._plain.popitem(last=False)
        return self.host, store.port
