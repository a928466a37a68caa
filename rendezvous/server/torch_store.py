"""The torch.distributed stores the rendezvous owns.

One long-lived TCPStore serves every elastic ring rebuild: each generation uses its own key
prefix, so a rebuild never reads a stale key and costs milliseconds instead of a new server.
Plain scripts (torchrun contract, TORCHELASTIC_USE_AGENT_STORE) key their rendezvous without a
prefix, so each planned generation of theirs gets a fresh store; the last few are kept.

torch is the rendezvous' only use of torch, and importing it takes 2 s of CPU. So each store's
socket is bound and listening at once (its port is known, connections queue in the backlog) and
the TCPStore that serves it is made on a thread of its own once torch is imported: the job's
agents and workers start while the rendezvous imports, instead of after.
"""

from __future__ import annotations

import socket
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Callable

#: Connections a store's listening socket queues (a ring of thousands connects at once).
LISTEN_BACKLOG = 4096
#: Planned-generation stores kept alive (older ones are closed).
KEEP_PLAIN_STORES = 2

#: Makes a TCPStore server on a listening socket: (advertised host, descriptor, timeout) -> store.
StoreMaker = Callable[[str, int, timedelta], Any]


def torch_tcp_store(host: str, listen_fd: int, timeout: timedelta) -> Any:
    """torch.distributed's TCPStore server on `listen_fd` (imports torch on first use)."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout,
                         master_listen_fd=listen_fd)


class TorchStoreHost:
    """The TCPStores the rings meet on (torch.distributed's, not the rendezvous' state store).

    A TCPStore server listens on every interface by itself; each of ours is handed a socket
    bound to the rendezvous' `bind` address instead, so `--bind 127.0.0.1` keeps it on this
    machine. Workers are told `advertise`, the name other hosts dial. The stores are made in
    order on one thread (`make_store`, torch's by default); `ready()` says when all asked for are
    serving, and raises what making one raised."""

    def __init__(self, bind: str = "127.0.0.1", advertise: str | None = None, timeout_s: float = 300.0,
                 make_store: StoreMaker = torch_tcp_store) -> None:
        self.bind = bind
        self.host = advertise or bind
        self._timeout = timedelta(seconds=timeout_s)
        self._make_store = make_store
        self._maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ring-stores")
        self.port, self.tcp_store = self._serve()
        self._plain: OrderedDict[int, Future] = OrderedDict()

    def _serve(self) -> tuple[int, Future]:
        listener = socket.create_server((self.bind, 0), backlog=LISTEN_BACKLOG)
        port = listener.getsockname()[1]
        return port, self._maker.submit(self._take, listener)

    def _take(self, listener: socket.socket) -> Any:
        try:
            store = self._make_store(self.host, listener.fileno(), self._timeout)
        except BaseException:
            listener.close()
            raise
        listener.detach()  # the store owns the descriptor now (and closes it)
        return store

    def ready(self, timeout_s: float | None = None) -> None:
        """Waits until every store asked for serves (the long-lived one and the plain ones)."""
        for future in [self.tcp_store, *self._plain.values()]:
            future.result(timeout_s)

    def problem(self) -> str | None:
        """Why a store asked for could not be made (torch missing, no descriptors), or None."""
        for future in [self.tcp_store, *self._plain.values()]:
            if future.done() and future.exception() is not None:
                return f"the rings' TCPStore could not be started: {future.exception()!r}"
        return None

    def plain_store(self, generation: int) -> tuple[str, int]:
        """A fresh store for the plain workers of `generation`."""
        port, store = self._serve()
        self._plain[generation] = store
        while len(self._plain) > KEEP_PLAIN_STORES:
            self._plain.popitem(last=False)
        return self.host, port

    def close(self) -> None:
        """Lets the thread end once the stores asked for are made (they close when dropped)."""
        self._maker.shutdown(wait=False)
