"""One ring's queue of Horovod operations, run in order by one background thread.

Horovod runs every collective on a background thread: `allreduce_async` returns a handle at
once, `synchronize` waits for it, and operations issued together are fused into one buffer.
Here each ring (the generation's, or a process set's) has an `OpQueue`: the caller queues an
`Operation` and gets it back as the handle; the queue's thread agrees with the other ranks on
what runs next (`negotiation`: one small allgather per round, matching the ranks' operations
by name as Horovod's coordinator does, so ranks may queue named operations in different orders
and disagreeing ranks get an error, not a broken ring; a small operation rides in that round and
is done from every rank's bytes, with no collective of its own), runs what every rank queued in
one order, fuses consecutive allreduces of one kind into one flat
buffer, sends the first operation's data during the round when it can (`speculation`), and
runs them on the ring with the ring's bounded waits (a dead or hung peer fails the operation
with `HorovodInternalError`, never hangs it).

Collectives issued on the ring directly (the optimizer's buckets, state syncs, object
broadcasts) first wait until the queue is empty (`drain`), so every rank sees one order.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from ringmaster.worker.train import flat, negotiation, speculation
from ringmaster.worker.train.early_data import EarlyData
from ringmaster.worker.train.errors import CollectiveMismatchError, HorovodInternalError
from ringmaster.worker.train.negotiation import Descriptor, Kind, Reduction
from ringmaster.worker.train.speculation import Speculation

#: Bytes fused into one buffer at most, by the operation queue and the optimizer's gradient
#: buckets (Horovod's HOROVOD_FUSION_THRESHOLD, 64 MB).
DEFAULT_FUSION_THRESHOLD_BYTES = 64 * 1024 * 1024
#: Environment variables that set it (bytes; 0: no fusion), RINGMASTER_ first.
#: (`ringmaster run --fusion-threshold-mb` sets RINGMASTER_FUSION_THRESHOLD for the workers.)
FUSION_THRESHOLD_ENV = ("RINGMASTER_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD")


#: A tensor this large is reduced alone, not packed with its neighbours: fusion saves a collective's
#: latency (a fraction of a millisecond) at the cost of copying the tensor into the buffer and back,
#: which passes that from a few MB on. Measured (2 ranks, 8 allreduces of 4 MB queued together
#: beside 13.5 ms of compute): fused 65 ms in all, each alone 44 ms, torch.distributed's 34 ms.
#: (Queued together they still share one negotiation round.)
FUSE_TENSOR_LIMIT_BYTES = 2 << 20


def fusion_threshold(environ: Mapping[str, str] | None = None) -> int:
    """The fusion size in bytes from the environment (RINGMASTER_ first, then HOROVOD_)."""
    env = os.environ if environ is None else environ
    for name in FUSION_THRESHOLD_ENV:
        value = env.get(name)
        if value:
            try:
                threshold = int(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a number of bytes; e.g. {name}=67108864 (64 MiB)") from None
            if threshold < 0:
                raise ValueError(f"{name}={value!r} must be 0 (no fusion) or a positive number of bytes")
            return threshold
    return DEFAULT_FUSION_THRESHOLD_BYTES


#: Environment variable with the most bytes of small operations a rank carries in a negotiation
#: round (0: none; at most negotiation.INLINE_AREA_BYTES, the default). Ranks may differ: an
#: operation is done inline only where every rank carried it.
INLINE_BYTES_ENV = "RINGMASTER_INLINE_BYTES"


def inline_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The inline budget from the environment (`INLINE_BYTES_ENV`), within the message's area."""
    value = (os.environ if environ is None else environ).get(INLINE_BYTES_ENV)
    if not value:
        return negotiation.INLINE_AREA_BYTES
    try:
        budget = int(value)
    except ValueError:
        raise ValueError(f"{INLINE_BYTES_ENV}={value!r} is not a number of bytes; e.g. {INLINE_BYTES_ENV}=0 (none "
                         f"inline) or {negotiation.INLINE_AREA_BYTES}") from None
    if budget < 0:
        raise ValueError(f"{INLINE_BYTES_ENV}={value!r} must be 0 (none inline) or a positive number of bytes")
    return min(budget, negotiation.INLINE_AREA_BYTES)


#: Environment variable that turns off sending a round's first operation's data before the round
#: agrees on it (`speculation`): "0" (default "1"). Ranks may differ: an operation's early data is
#: used only where every rank sent it.
EARLY_DATA_ENV = "RINGMASTER_EARLY_DATA"


def early_data_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether operations' data goes out before their round (`EARLY_DATA_ENV`)."""
    value = (os.environ if environ is None else environ).get(EARLY_DATA_ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{EARLY_DATA_ENV}={value!r}: give 1 (send an operation's data during its round, the "
                         "default) or 0 (after it)")
    return value == "1"


#: Called with each operation once it is settled (`hvd.start_timeline` records them).
OBSERVERS: list[Callable[["Operation"], None]] = []


def _spent(comm: Any) -> Any:
    raise RuntimeError("this operation has run already")


@dataclass(frozen=True)
class FuseKey:
    """Allreduces with equal keys, issued one after another, are reduced as one buffer."""

    dtype: torch.dtype
    device: torch.device
    op: Any
    prescale: float
    postscale: float


@dataclass(eq=False)
class Operation:
    """A queued collective; the caller's handle. `run(comm)` does it on the ring (blocking,
    bounded) and returns its output. An allreduce may be fused with its neighbours (`fuse`):
    its `inputs` are then packed with theirs, the buffer reduced by `reduce(comm, buffer)`,
    unpacked into its `outputs`, and `finish()` gives its output."""

    descriptor: Descriptor
    run: Callable[[Any], Any]
    fuse: FuseKey | None = None
    inputs: tuple[torch.Tensor, ...] = ()
    outputs: tuple[torch.Tensor, ...] = ()
    #: starts reducing a fused buffer in place and returns the wait for it
    reduce: Callable[[Any, torch.Tensor], Callable[[], None]] | None = None
    finish: Callable[[], Any] | None = None
    #: `run` in two halves, when the operation can be left in flight: starts its collective and
    #: returns at once with the wait that gives its output. The queue starts consecutive such
    #: operations before waiting for the first, so they follow each other on the ring back to
    #: back instead of each waiting for this thread to be scheduled between them.
    start: Callable[[Any], Callable[[], Any]] | None = None
    #: the operation done inside the negotiation round, for a small one: `inline(comm, budget)`
    #: gives this rank's bytes for it (1-D uint8, at most `budget`; None when they do not fit) and
    #: `complete(comm, every_ranks_bytes)` its output from every rank's (`negotiation.Verdict.inline`)
    inline: Callable[[Any, int], torch.Tensor | None] | None = None
    complete: Callable[[Any, list[torch.Tensor]], Any] | None = None
    #: its data sent while the round runs, for an allgather, alltoall or reducescatter:
    #: `speculate(comm)` posts nothing itself, it says what to send and where to receive, guessing
    #: that every rank issues the same (`speculation.Speculation`; None when it cannot)
    speculate: Callable[[Any], Speculation | None] | None = None
    #: each rank's first dimension, when the negotiation told it (an allgather's)
    peer_dims: list[int] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    #: when it was queued, taken up by the queue's thread, settled (time.time(); for timelines)
    queued_at: float = field(default_factory=time.time)
    started_at: float = 0.0
    ended_at: float = 0.0

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        # The closures may refer to this operation (an allgather reads its `peer_dims`): dropped
        # now, so no reference cycle keeps the result alive once the caller drops it.
        self.run = _spent
        self.reduce = self.finish = self.start = self.inline = self.complete = self.speculate = None
        self.ended_at = time.time()
        self.done.set()
        for observer in list(OBSERVERS):
            observer(self)

    def outcome(self) -> Any:
        """The output once done; the operation's error raised on the caller's thread."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class OpQueue:
    """The queue of one ring (`comm`: a `Communicator`); its thread starts with the first operation."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self._lock = threading.Condition()
        self._queued: list[Operation] = []
        self._owner: int | None = None  # the thread running a round now (the queue's, or a caller's)
        self._thread: threading.Thread | None = None
        self._broken: HorovodInternalError | None = None
        self._closed = False
        self._fusion_bytes = fusion_threshold()
        self.inline_bytes = inline_bytes()
        self.sends_early = early_data_enabled()
        self._rounds = 0  # rounds on this ring so far (the same count on every rank: tags of early data)
        self._next_seq = 0  # the place of the next unnamed operation among this ring's (`Descriptor.seq`)
        self._joined_at: int | None = None  # the round in which this rank joined (`hvd.join()`), while it has
        self._quiet = 0  # rounds in a row that settled nothing here (the next waits a little for news)
        self._submitted = 0  # operations queued so far (news for a round that waits after quiet ones)

    # ------------------------------------------------------------ the caller's side
    def submit(self, operation: Operation) -> Operation:
        """Queue `operation` for the queue's thread; it is the caller's handle."""
        with self._lock:
            if self._refuse(operation):
                return operation
            self._enqueue(operation)
            self._start_thread()
            self._lock.notify_all()
        return operation

    def run_here(self, operation: Operation) -> Operation:
        """Run `operation` on the caller's thread when nothing is queued or running (a caller that
        waits for it anyway saves the hand-over to the queue's thread); otherwise queue it.
        Either way it is done, or queued, when this returns: wait with `outcome()`."""
        with self._lock:
            if self._refuse(operation):
                return operation
            if self._queued or self._owner is not None:
                return self.submit(operation)
            self._owner = threading.get_ident()  # the queue is this thread's until the round ends
            self._enqueue(operation)
        self._take_round([operation])
        return operation

    def _enqueue(self, operation: Operation) -> None:
        """Queue it (the lock held), giving an unnamed operation its place among the ring's
        unnamed ones: the key by which the ranks match it (a join takes none: it is not matched)."""
        d = operation.descriptor
        if d.name is None and d.kind != Kind.JOIN:
            operation.descriptor = dataclasses.replace(d, seq=self._next_seq)
            self._next_seq += 1
        self._queued.append(operation)
        self._submitted += 1

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ringmaster-ops", daemon=True)
            self._thread.start()

    def _refuse(self, operation: Operation) -> bool:
        if self._broken is None and not self._closed:
            return False
        operation.settle(error=self._broken or HorovodInternalError(
            f"the ring of generation {self.comm.generation} is gone; the operation was not run"))
        return True

    def on_thread(self) -> bool:
        """Is the caller the thread running the queue's operations now? (Its own collectives on
        the ring must not wait for the queue to drain.)"""
        return self._owner == threading.get_ident()

    @property
    def busy(self) -> bool:
        return bool(self._queued) or self._owner is not None

    @property
    def usable(self) -> bool:
        """Is the ring still taking operations (not retired, not broken)?"""
        return self._broken is None and not self._closed

    def drain(self) -> None:
        """Wait until every queued operation has run (each is bounded, so this is too)."""
        with self._lock:
            while self._queued or self._owner is not None:
                self._lock.wait()

    def close(self, reason: str) -> None:
        """The ring is being retired: what is queued fails, the thread ends."""
        with self._lock:
            self._closed = True
            error = HorovodInternalError(f"generation {self.comm.generation} ended before the operation ran: {reason}")
            for operation in self._queued:
                if self._owner is None or not operation.started_at:
                    operation.settle(error=error)
            self._queued.clear()
            self._lock.notify_all()

    # ------------------------------------------------------------ running rounds
    def _loop(self) -> None:
        try:
            while self._next_round():
                pass
        except BaseException as exc:  # (a defect here: fail what is queued rather than leave it waiting forever)
            self._fail_all(HorovodInternalError(f"the operations' thread of generation {self.comm.generation} "
                                                f"failed: {type(exc).__name__}: {exc}"))
            raise

    def _next_round(self) -> bool:
        """Take what is queued, run it; False once the queue is closed or broken. (A method of
        its own so nothing of a finished round stays referenced while the thread waits: a
        result the caller dropped is free memory at once, for `ResultPool`.) After a round that
        settled nothing here (the ranks' queues did not meet yet), the next waits a little for
        an operation to be queued, not spinning rounds while every rank's caller is busy."""
        with self._lock:
            seen = self._submitted
            deadline = time.monotonic() + quiet_wait_s(self._quiet) if self._quiet else 0.0
            while True:
                if self._closed or self._broken is not None:
                    return False
                if self._queued and self._owner is None:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._submitted != seen:
                        break
                    self._lock.wait(left)
                else:
                    self._lock.wait()
            batch = self._queued[: negotiation.BATCH]
            self._owner = threading.get_ident()
        return self._take_round(batch)

    def _take_round(self, batch: list[Operation]) -> bool:
        """Run one round of `batch` (the head of the queue, owned by this thread); False when the
        ring broke (everything queued then fails with it)."""
        try:
            progressed = self._round(batch)
        except BaseException as exc:  # the ring broke: everything queued fails with it
            self._fail_all(exc if isinstance(exc, HorovodInternalError) else HorovodInternalError(str(exc)), batch)
            return False
        with self._lock:
            self._queued = [o for o in self._queued if not o.done.is_set()]
            self._owner = None
            self._quiet = 0 if progressed else self._quiet + 1
            if self._queued:
                self._start_thread()  # (a round on a caller's thread may leave operations that did not meet yet)
            self._lock.notify_all()
        return True

    def _fail_all(self, error: HorovodInternalError, batch: Sequence[Operation] = ()) -> None:
        """The ring broke: everything queued (and `batch`, the round that broke) fails with it."""
        with self._lock:
            self._broken = error
            for operation in [*batch, *self._queued]:
                if not operation.done.is_set():
                    operation.settle(error=error)
            self._queued.clear()
            self._owner = None
            self._lock.notify_all()

    def _round(self, batch: list[Operation]) -> bool:
        """Agree on what runs, run it. The operations before the first join are described; a
        rank whose queue starts with a join has joined (`negotiation.Head.joined`). True when the
        round settled anything here."""
        cut = next((i for i, o in enumerate(batch) if o.descriptor.kind == Kind.JOIN), len(batch))
        described, joined = batch[:cut], cut == 0
        started = time.time()
        for operation in batch[: cut + 1]:
            operation.started_at = operation.started_at or started
        if joined and self._joined_at is None:
            self._joined_at = self._rounds
        number = self._rounds
        self._rounds += 1
        descriptors = [o.descriptor for o in described]
        early: EarlyData | None = None
        early_done, early_bytes = False, None
        if self.comm.size == 1:
            verdict = negotiation.alone(descriptors, joined)
        else:
            stalled = bool(described) and started - min(o.started_at for o in described) > self.comm.timeout_s
            carried = self._inline(described)
            early = self._early(described[0] if described else None, carried[0] if carried else None, number)
            joined_at = self._joined_at if joined and self._joined_at is not None else -1
            head = negotiation.Head(len(descriptors), joined, joined_at, stalled, self._next_seq)
            message = negotiation.encode(descriptors, carried, early.announcement if early else None, head)
            messages, pending = self.comm.allgather_async(message)
            if early is not None:
                # The data after the round's message, so the round is not queued behind it on the
                # wire (faster than the data first, docs/benchmarks.md); the receives were posted
                # before either.
                early.send()
            pending.wait()
            verdict = negotiation.decide(messages, descriptors, self.comm.rank)
            if early is not None:
                try:
                    announced = negotiation.announcements(messages)
                except ValueError as exc:
                    raise HorovodInternalError(
                        f"the operations' round in generation {self.comm.generation}: {exc}") from exc
                early_done, early_bytes = early.complete(announced)
        if verdict.stalled:
            self._give_up(verdict, described)
        if verdict.last_joined is not None:  # every rank has joined: each join returns the last to
            self._joined_at = None
            self._next_seq = max(self._next_seq, verdict.next_seq)
            batch[0].settle(verdict.last_joined)
        runnable: list[Operation | tuple[int, ...]] = []  # (a row: this rank stands in for it, having joined)
        for i, agreed in enumerate(verdict.agreed):
            if agreed.mine is None:
                if not agreed.refused:  # (a refused one runs nowhere)
                    runnable.append(agreed.row)
                continue
            operation = described[agreed.mine]
            if agreed.refused:
                operation.settle(error=CollectiveMismatchError(agreed.refused))
                continue
            operation.peer_dims = agreed.first_dims
            complete, payloads = operation.complete, agreed.inline
            if payloads is not None and complete is not None:  # done: every rank's bytes came with the round
                self._settle(operation, lambda: complete(self.comm, payloads))
            elif i == 0 and verdict.first_shared and early_done and early is not None and early.early is not None:
                finish = early.early.finish  # its data came with it
                self._settle(operation, lambda: finish(early_bytes))
            else:
                runnable.append(operation)
        if verdict.joined:
            for item in runnable:
                self._run_while_joined(item)
        else:
            self._run_fused([o for o in runnable if isinstance(o, Operation)])
        progressed = bool(verdict.agreed or verdict.abandoned or verdict.last_joined is not None)
        return progressed

    def _give_up(self, verdict: negotiation.Verdict, described: list[Operation]) -> None:
        """A rank waited the collective timeout for operations the others never issued: every
        rank fails what it waited for (the operations of this round that did not meet, and those
        queued behind them), and the ring's unnamed operations go on from one place (every rank's
        furthest), so the next ones meet again. Under the lock: one queued from now on is new."""
        agreed = {id(described[a.mine]) for a in verdict.agreed if a.mine is not None}
        with self._lock:
            self._next_seq = max(self._next_seq, verdict.next_seq)
            for i, why in verdict.abandoned.items():
                described[i].settle(error=CollectiveMismatchError(why))
            for operation in self._queued:
                if (not operation.done.is_set() and id(operation) not in agreed
                        and operation.descriptor.kind != Kind.JOIN):
                    operation.settle(error=CollectiveMismatchError(
                        f"{operation.descriptor.what()} was given up with the operations queued before it: the "
                        "ranks' queues did not meet within the collective timeout (see the error of the first)"))

    def _run_fused(self, runnable: list[Operation]) -> None:
        in_flight: list[Callable[[], None]] = []  # the waits of groups started, in start order
        for group in self._fused(runnable):
            if len(group) == 1 and group[0].start is None:
                self._wait_for(in_flight)  # an operation that cannot be left in flight settles in order
                self._run(group[0])
            else:
                wait = self._start(group)
                if wait is not None:
                    in_flight.append(wait)
        self._wait_for(in_flight)

    def _run_while_joined(self, item: "Operation | tuple[int, ...]") -> None:
        """One operation while some rank has joined, alone and in order on every rank: an
        allreduce reduced in place from a copy of its inputs (the joined rank adds the identity
        of the reduction, built from the row: `stand_in`), a barrier as its small allreduce."""
        if not isinstance(item, Operation):
            stand_in(self.comm, item)
            return
        if item.descriptor.kind == Kind.BARRIER:
            self._run(item)
            return
        reduce = item.reduce
        assert reduce is not None and item.finish is not None
        finish = item.finish

        def reduced() -> Any:
            packed = flat.pack(list(item.inputs))
            reduce(self.comm, packed)()
            flat.unpack(packed, list(item.outputs))
            return finish()

        self._settle(item, reduced)

    def _early(self, operation: Operation | None, carried: torch.Tensor | None, number: int) -> EarlyData | None:
        """The round's early transfers, started (None on a ring too large for them: then no rank
        sends early). The first operation's data goes out now when it can: not carried inline,
        every transfer within `speculation.MAX_BYTES`. An operation whose data cannot be taken (a
        local error) sends nothing early and runs as a collective, where the error is its own."""
        if not speculation.ring_sends_early(self.comm.size):
            return None
        early = None
        if operation is not None and carried is None and self.sends_early and operation.speculate is not None:
            try:
                early = operation.speculate(self.comm)
            except (RuntimeError, ValueError, TypeError, IndexError):
                early = None
            if early is not None and not early.fits(self.comm.size):
                early = None
        return EarlyData(self.comm.pg, self.comm.rank, self.comm.size, number + 1, early, self.comm.timeout_s,
                         self.comm.generation).receive()

    def _inline(self, batch: list[Operation]) -> list[torch.Tensor | None]:
        """This rank's bytes of each small operation of `batch` that fits what is left of the
        budget (None for the others, which run as collectives). An operation whose bytes cannot
        be taken (torch refuses a tensor's byte view, or a bad split: a local error) is left to
        run as a collective, where the error is its own."""
        left = self.inline_bytes
        carried: list[torch.Tensor | None] = []
        for operation in batch:
            payload = None
            if operation.inline is not None and operation.complete is not None and left >= 0:
                try:
                    payload = operation.inline(self.comm, left)
                except (RuntimeError, ValueError, TypeError, IndexError):
                    payload = None
            if payload is not None:
                left -= payload.numel()
            carried.append(payload)
        return carried

    def _fused(self, operations: list[Operation]) -> list[list[Operation]]:
        """Consecutive allreduces of one kind, up to the fusion threshold, as one group each;
        a tensor of FUSE_TENSOR_LIMIT_BYTES or more alone."""
        groups: list[list[Operation]] = []
        size = 0
        open_group = False  # the last group takes more (its tensors are small)
        for operation in operations:
            last = groups[-1] if groups else None
            nbytes = sum(t.numel() * t.element_size() for t in operation.inputs)
            small = nbytes < FUSE_TENSOR_LIMIT_BYTES
            if (last is not None and open_group and small and operation.fuse is not None
                    and last[-1].fuse == operation.fuse and size + nbytes <= self._fusion_bytes):
                last.append(operation)
                size += nbytes
            else:
                groups.append([operation])
                size, open_group = nbytes, small
        return groups

    @staticmethod
    def _wait_for(in_flight: list[Callable[[], None]]) -> None:
        for wait in in_flight:
            wait()
        in_flight.clear()

    def _run(self, operation: Operation) -> None:
        self._settle(operation, lambda: operation.run(self.comm))

    @staticmethod
    def _settle(operation: Operation, outcome: Callable[[], Any]) -> None:
        """Settle `operation` with `outcome()`, or with its error when that failed locally
        (memory, a bad tensor: this operation's alone). A broken ring raises on, failing the round."""
        try:
            result = outcome()
        except HorovodInternalError:
            raise
        except Exception as exc:
            operation.settle(error=exc)
            return
        operation.settle(result)

    def _start(self, group: list[Operation]) -> Callable[[], None] | None:
        """Start one group's collective; the wait that settles its operations (None when the
        operation failed before anything went out)."""
        start = group[0].start
        if len(group) == 1 and start is not None:
            operation = group[0]
            try:
                output = start(self.comm)
            except HorovodInternalError:
                raise
            except Exception as exc:  # nothing went out: this operation's error alone
                operation.settle(error=exc)
                return None
            return lambda: self._settle(operation, output)
        reduce = group[0].reduce
        assert reduce is not None and all(o.finish is not None for o in group)
        packed = flat.pack([t for o in group for t in o.inputs])
        reduced = reduce(self.comm, packed)

        def settle_group() -> None:
            reduced()
            flat.unpack(packed, [t for o in group for t in o.outputs])
            for operation in group:
                operation.settle(operation.finish())  # type: ignore[misc]

        return settle_group


#: After a round that settled nothing here, the next waits this long for an operation to be
#: queued (doubling with each such round, up to `QUIET_WAIT_MAX_S`).
QUIET_WAIT_S = 0.0005
QUIET_WAIT_MAX_S = 0.02


def quiet_wait_s(quiet_rounds: int) -> float:
    """How long the round after `quiet_rounds` quiet ones waits for news (the doubling stops at
    the cap: a queue may wait through thousands of quiet rounds for a slow peer)."""
    return min(QUIET_WAIT_MAX_S, QUIET_WAIT_S * (2 ** min(max(0, quiet_rounds - 1), 16)))


#: The identity of each reduction: what a joined rank adds (zeros for a sum, as Horovod's joined ranks send).
_REDUCE_OPS = {Reduction.SUM: dist.ReduceOp.SUM, Reduction.AVERAGE: dist.ReduceOp.SUM, Reduction.MIN: dist.ReduceOp.MIN,
               Reduction.MAX: dist.ReduceOp.MAX, Reduction.PRODUCT: dist.ReduceOp.PRODUCT}


def identity_of(reduction: int, dtype: torch.dtype) -> float | int | bool:
    """The value that leaves a reduction unchanged (a joined rank's part of an allreduce)."""
    if reduction == Reduction.PRODUCT:
        return True if dtype == torch.bool else 1
    if reduction not in (Reduction.MIN, Reduction.MAX):
        return False if dtype == torch.bool else 0
    if dtype == torch.bool:
        return reduction == Reduction.MIN
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    if dtype.is_floating_point:
        return float("inf") if reduction == Reduction.MIN else float("-inf")
    return info.max if reduction == Reduction.MIN else info.min


def stand_in(comm: Any, row: tuple[int, ...]) -> None:
    """A joined rank's part of an operation the others run (`negotiation.WHILE_JOINED`): the
    same collective on the wire, from the row alone (the reduction's identity for an allreduce,
    Horovod's zeros for a sum; a barrier's small allreduce)."""
    if negotiation.field_of(row, "kind") == Kind.BARRIER:
        comm.allreduce_(torch.zeros(1))
        return
    dtype = negotiation.dtype_of(row)
    assert dtype is not None  # (a dtype unknown here is refused by `negotiation.decide`)
    reduction = negotiation.field_of(row, "op")
    device = torch.device("cuda", torch.cuda.current_device()) if negotiation.field_of(row, "device") else None
    buffer = torch.full((negotiation.field_of(row, "numel"),), identity_of(reduction, dtype), dtype=dtype,
                        device=device)
    comm.allreduce_async_(buffer, _REDUCE_OPS[Reduction(reduction)]).wait()

