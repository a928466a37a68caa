"""Exceptions of the training library, with Horovod's names where Horovod has them."""

from ringmaster.common.errors import JobError, JobFatalError


class HorovodInternalError(JobError, RuntimeError):
    """A collective failed or was aborted because a peer died or hung.

    `hvd.elastic.run` catches it, restores the last commit and re-forms the ring.
    """


#: Ringmaster's own name for the same error.
WorkersFailedError = HorovodInternalError


class CollectiveMismatchError(JobError, RuntimeError):
    """The ranks called different collectives at the same point (another op, shape, dtype, name,
    root or scale). Raised on every rank; the ring stays usable. Not a `HorovodInternalError`:
    nothing failed, the script disagrees with itself, so `hvd.elastic.run` does not roll back."""


class HostsUpdatedInterrupt(JobError, RuntimeError):
    """Raised at `commit()`/`check_host_updates()` on every rank at the same step when the ring
    should change (hosts added or removed). Nothing is rolled back.

    `committed` is true when it was raised by `commit()`, right after the commit: the live state
    is then the commit. Raised by a bare `check_host_updates()`, the live state is newer than
    the commit, and `hvd.elastic.run` makes it the commit that the next ring starts from."""

    def __init__(self, skip_sync: bool = False, committed: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
        self.committed = committed


class ReplicasDivergedError(JobError, RuntimeError):
    """After a reset, some rank's live state still differed from rank 0's after a second sync:
    something makes the state depend on the rank (a reset callback, most often). Training on
    would silently train different models, so the worker stops."""


class CheckpointMismatchError(JobFatalError, RuntimeError):
    """The newest durable checkpoint does not fit the model being trained (another model's
    folder, or the model changed). The message names the checkpoint and what differs; the
    worker stops rather than train from a state it cannot load."""
