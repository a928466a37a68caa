"""Exceptions of the training library, with Horovod's names where Horovod has them."""


class HorovodInternalError(RuntimeError):
    """A collective failed or was aborted because a peer died or hung.

    `hvd.elastic.run` catches it, restores the last commit and re-forms the ring.
    """


#: Ringmaster's own name for the same error.
WorkersFailedError = HorovodInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Raised at `commit()`/`check_host_updates()` on every rank at the same step when the ring
    should change (hosts added or removed). Nothing is rolled back."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
