"""Collectives of one generation, each bounded so a dead or hung peer never hangs training.

Every collective is issued with `async_op` and waited on (after a first 2 ms in Gloo's own wait,
where most finish) through its future together with the
rendezvous' "generation over" signal and a deadline (`--collective-timeout`): a killed peer
fails the collective within milliseconds ("Connection closed by peer"), a stopped one ends the
wait when the rendezvous declares the generation over or the deadline passes. Either way the
caller gets `HorovodInternalError` and `hvd.elastic.run` rolls back and re-forms the ring.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from ringmaster.common.network import NetworkError, interface_names, route_address
from ringmaster.proto import environment as env_names
from ringmaster.worker.train import exchange, gloo_types, ring_sum
from ringmaster.worker.train.errors import HorovodInternalError
from ringmaster.worker.train.link import RendezvousLink
from ringmaster.worker.train.op_queue import OpQueue

ReduceOp = dist.ReduceOp
#: A Gloo collective is first waited for this long in Gloo's own wait, which cannot be woken by
#: the generation-over signal: a ring abandoned by the rendezvous is left at most this much later.
SHORT_WAIT = timedelta(milliseconds=2)
#: The futures of finished collectives are dropped once this many are kept (each holds its
#: tensors: kept for a whole generation, every result of `hvd.allreduce` would stay in memory).
_PRUNE_AT = 32
#: A c10d process group object (ProcessGroupGloo / ProcessGroupNCCL); the stubs type them apart.
Ring = Any
#: Builds the rings of a process set of this generation: (its ranks) -> (Gloo ring, NCCL ring or None).
SubringMaker = Callable[[tuple[int, ...]], tuple[Ring, Ring | None]]


class Communicator:
    """`pg` is a Gloo ring for CPU tensors (always there: control traffic such as host-update
    agreement and object broadcasts is on the CPU); `cuda_pg`, on GPU machines, an NCCL ring for
    CUDA tensors. Each collective goes to the ring of its tensor's device."""

    def __init__(
        self,
        pg: Ring,
        rank: int,
        size: int,
        generation: int,
        link: RendezvousLink | None,
        timeout_s: float,
        cuda_pg: Ring | None = None,
        make_subring: SubringMaker | None = None,
        cuda_refusal: str | None = None,
    ) -> None:
        self.pg = pg
        self.cuda_pg = cuda_pg
        #: why this ring has no NCCL ring where the job asked for one (`gpu_sharing.nccl_refusal`)
        self.cuda_refusal = cuda_refusal
        self.rank = rank
        self.size = size
        self.generation = generation
        self.link = link
        self.timeout_s = timeout_s
        self._in_flight: list[torch.futures.Future] = []  # issued, not known to be done
        self._ring_sum: ring_sum.RingSum | None = None  # made at the first sum that goes around it
        self._make_subring = make_subring
        self._subgroups: dict[tuple[int, ...], "Communicator"] = {}
        self._ops: OpQueue | None = None  # Horovod's operations on this ring, in order (made at the first)

    # ------------------------------------------------------------ queued operations and process sets
    @property
    def ops(self) -> OpQueue:
        """The queue of Horovod operations on this ring (`hvd.allreduce` and the rest)."""
        if self._ops is None:
            self._ops = OpQueue(self)
        return self._ops

    def subgroup(self, ranks: tuple[int, ...]) -> "Communicator":
        """The ring of the process set `ranks` (sorted ranks of this generation, this rank among
        them), built by its members the first time they use it in this generation."""
        found = self._subgroups.get(ranks)
        if found is not None:
            return found
        if ranks == tuple(range(self.size)):
            return self
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not in the process set {list(ranks)}")
        if len(ranks) == 1:
            ring, cuda_ring = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=self.timeout_s)), None
        elif self._make_subring is None:
            raise ValueError("process sets need a ring made by the rendezvous (this communicator has none)")
        else:
            ring, cuda_ring = self._make_subring(ranks)
        made = Communicator(ring, ranks.index(self.rank), len(ranks), self.generation, self.link, self.timeout_s,
                            cuda_ring, cuda_refusal=self.cuda_refusal)
        self._subgroups[ranks] = made
        return made

    def close(self, reason: str) -> None:
        """This generation's ring is being retired: queued operations fail, process sets' rings go too."""
        for sub in self._subgroups.values():
            sub.close(reason)
            sub.abort()
        if self._ops is not None:
            self._ops.close(reason)

    @property
    def idle(self) -> bool:
        """No collective is in flight, so the group can be destroyed without blocking."""
        self._in_flight = [f for f in self._in_flight if not f.done()]
        return not self._in_flight and all(sub.idle for sub in self._subgroups.values())

    # ------------------------------------------------------------ collectives (in place)
    def allreduce_(self, tensor: torch.Tensor, op: Any = ReduceOp.SUM) -> torch.Tensor:
        self.allreduce_async_(tensor, op).wait()
        return tensor

    def allreduce_async_(self, tensor: torch.Tensor, op: Any = ReduceOp.SUM) -> "Pending":
        """Start reducing `tensor` in place and return at once; `Pending.wait()` waits for it, as
        boundedly as every other collective. Collectives started this way go out in the order
        they are started, which must be the same on every rank. Large float16/bfloat16 sums on
        the CPU go around `RingSum` (Gloo's own half-precision sums are slow)."""
        if self.size == 1:
            return Pending(self, None, "allreduce")
        if not gloo_types.native(tensor):  # reduced in a dtype Gloo takes, then copied back
            carrier, back = gloo_types.for_reduction(tensor, op)
            return self.allreduce_async_(carrier, op).then(back)
        if op == ReduceOp.SUM and ring_sum.takes(tensor, self.size):
            ring = self._ring_sums()
            return Pending(self, self._issue_future(lambda: ring.sum_async_(tensor), "allreduce"), "allreduce")
        options = dist.AllreduceOptions()
        options.reduceOp = op
        return Pending(self, self._issue(lambda: self._ring(tensor).allreduce([tensor], options),
                                         "allreduce"), "allreduce")

    def sum_into_async_(self, source: torch.Tensor, out: torch.Tensor, scale: float = 1.0) -> "Pending":
        """Start summing `source` (left alone) into `out` (same shape and dtype, contiguous), then
        multiplying by `scale`. Large CPU tensors go around `RingSum`, which sends from `source`
        and receives into `out` with no copy; others are copied (scaled) into `out` and summed
        there (the scale then applies before the sum: the same value up to rounding). `source`
        may be read until `wait()` returns: leave it alone until then."""
        if ring_sum.takes_into(source, self.size):
            ring = self._ring_sums()
            return Pending(self, self._issue_future(lambda: ring.sum_into_async_(source, out, scale), "allreduce"),
                           "allreduce")
        torch.mul(source, scale, out=out) if scale != 1.0 else out.copy_(source)
        return self.allreduce_async_(out)

    def _ring_sums(self) -> ring_sum.RingSum:
        if self._ring_sum is None:
            self._ring_sum = ring_sum.RingSum(self.pg, self.rank, self.size, self.timeout_s)
        return self._ring_sum

    def broadcast_(self, tensor: torch.Tensor, root_rank: int) -> torch.Tensor:
        self.broadcast_async_(tensor, root_rank).wait()
        return tensor

    def broadcast_async_(self, tensor: torch.Tensor, root_rank: int) -> "Pending":
        if self.size == 1:
            return Pending(self, None, "broadcast")
        if not gloo_types.native(tensor):  # its bytes (of a contiguous copy, written back, if need be)
            carrier = tensor if tensor.is_contiguous() else tensor.contiguous()
            pending = self.broadcast_async_(gloo_types.as_bytes(carrier), root_rank)
            return pending if carrier is tensor else pending.then(lambda: tensor.copy_(carrier))
        options = dist.BroadcastOptions()
        options.rootRank = root_rank
        options.rootTensor = 0
        return Pending(self, self._issue(lambda: self._ring(tensor).broadcast([tensor], options), "broadcast"),
                       "broadcast")

    def allgather_into_async(self, out: torch.Tensor, tensor: torch.Tensor) -> "Pending":
        """Every rank's `tensor` (same shape everywhere, contiguous) one after another into `out`."""
        if self.size == 1:
            out.copy_(tensor.reshape(out.shape))
            return Pending(self, None, "allgather")
        return Pending(self, self._issue(lambda: self._ring(tensor)._allgather_base(out, tensor), "allgather"),
                       "allgather")

    def alltoall_async(self, out: torch.Tensor, tensor: torch.Tensor, out_splits: list[int],
                       in_splits: list[int]) -> "Pending":
        """Rows `in_splits[j]` of `tensor` to rank j; rows `out_splits[j]` of `out` from rank j."""
        if self.size == 1:
            out.copy_(tensor[: out.shape[0]])
            return Pending(self, None, "alltoall")
        options = dist.AllToAllOptions()
        return Pending(self, self._issue(
            lambda: self._ring(tensor).alltoall_base(out, tensor, out_splits, in_splits, options), "alltoall"),
            "alltoall")

    def exchange_async(self, sends: list[torch.Tensor | None], receives: list[torch.Tensor | None],
                       what: str) -> "Pending":
        """`sends[j]` to rank j and rank j's bytes into `receives[j]` (CPU, contiguous; this
        rank's own entries are left alone), one point-to-point transfer each, all at once
        (`exchange`): an alltoall or an allgather whose sizes every rank knows."""
        if self.size == 1:
            return Pending(self, None, what)
        tag = self._ring_sums().take_tags(1)
        return Pending(self, self._issue_future(
            lambda: exchange.start(self.pg, self.rank, sends, receives, tag, self.timeout_s), what), what)

    def reduce_scatter_async(self, out: torch.Tensor, tensor: torch.Tensor, op: Any = ReduceOp.SUM) -> "Pending":
        """Reduce `tensor` (size x `out`'s elements, contiguous) and leave this rank's part in `out`."""
        if self.size == 1:
            out.copy_(tensor.reshape(out.shape))
            return Pending(self, None, "reducescatter")
        if not gloo_types.native(tensor):  # reduced in a dtype Gloo takes, then copied back
            wide_in, _ = gloo_types.for_reduction(tensor, op)
            wide_out, back = gloo_types.for_reduction(out, op)
            return self.reduce_scatter_async(wide_out, wide_in, op).then(back)
        options = dist.ReduceScatterOptions()
        options.reduceOp = op
        return Pending(self, self._issue(lambda: self._ring(tensor)._reduce_scatter_base(out, tensor, options),
                                         "reducescatter"), "reducescatter")

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Same-shaped tensors from every rank, in rank order."""
        outputs, pending = self.allgather_async(tensor)
        pending.wait()
        return outputs

    def allgather_async(self, tensor: torch.Tensor) -> tuple[list[torch.Tensor], "Pending"]:
        """Start `allgather`: the outputs (rank order), filled once the pending collective is waited for."""
        if self.size == 1:
            return [tensor.clone()], Pending(self, None, "allgather")
        if not gloo_types.native(tensor):  # every rank's bytes, straight into the outputs' own
            outputs = [torch.empty_like(tensor, memory_format=torch.contiguous_format) for _ in range(self.size)]
            return outputs, self._allgather_into([gloo_types.as_bytes(o) for o in outputs],
                                                 gloo_types.as_bytes(tensor.contiguous()))
        outputs = [torch.empty_like(tensor) for _ in range(self.size)]
        return outputs, self._allgather_into(outputs, tensor)

    def _allgather_into(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> "Pending":
        return Pending(self, self._issue(lambda: self._ring(tensor).allgather([outputs], [tensor]), "allgather"),
                       "allgather")

    def send(self, tensor: torch.Tensor, dst_rank: int) -> None:
        """Point-to-point: hand `tensor` to `dst_rank` (which calls `recv_`)."""
        self._wait(lambda: self._ring(tensor).send([tensor], dst_rank, 0), f"send to rank {dst_rank}")

    def recv_(self, tensor: torch.Tensor, src_rank: int) -> torch.Tensor:
        self._wait(lambda: self._ring(tensor).recv([tensor], src_rank, 0), f"receive from rank {src_rank}")
        return tensor

    def _ring(self, tensor: torch.Tensor) -> Ring:
        if tensor.is_cuda:
            if self.cuda_pg is None:
                raise ValueError(self.cuda_refusal or "a CUDA tensor was given but this job has no NCCL ring "
                                 "(RINGMASTER_BACKEND=gloo?)")
            return self.cuda_pg
        return self.pg

    def abort(self) -> None:
        """Abort the NCCL ring so no kernel of it can hang the device (Gloo needs nothing)."""
        if self.cuda_pg is not None:
            try:
                self.cuda_pg.abort()
            except RuntimeError:
                pass

    def barrier(self) -> None:
        self.allreduce_(torch.zeros(1))

    # ------------------------------------------------------------ bounded wait
    def _wait(self, issue: Callable[[], dist.Work], what: str) -> None:
        self._await(*self._issue(issue, what), what)

    def _issue(self, issue: Callable[[], dist.Work], what: str) -> tuple[torch.futures.Future, dist.Work | None]:
        """Start a collective (unless the generation is already over): its future, and its work
        when it may first be waited for in Gloo's own wait (`_await_short`)."""
        started: list[dist.Work] = []

        def start() -> torch.futures.Future:
            work = issue()
            future, own = _future_of(work)
            if own and self.cuda_pg is None:  # a Gloo collective (not Gloo's send/recv, not NCCL)
                started.append(work)
            return future

        future = self._issue_future(start, what)
        return future, (started[0] if started else None)

    def _issue_future(self, issue: Callable[[], torch.futures.Future], what: str) -> torch.futures.Future:
        if self._ops is not None and self._ops.busy and not self._ops.on_thread():
            self._ops.drain()  # queued Horovod operations go first: every rank issues in one order
        if self.link is not None:
            self._raise_if_over(what)
        try:
            future = issue()
        except RuntimeError as exc:
            raise HorovodInternalError(f"{what} failed in generation {self.generation}: {exc}") from exc
        if len(self._in_flight) >= _PRUNE_AT:
            self._in_flight = [f for f in self._in_flight if not f.done()]  # a done future holds its tensors
        self._in_flight.append(future)
        return future

    def _await(self, future: torch.futures.Future, work: dist.Work | None, what: str) -> None:
        """Wait for a started collective, together with the generation-over signal and the
        deadline; HorovodInternalError when it fails or cannot finish."""
        if self.link is None:
            try:
                future.wait()
            except RuntimeError as exc:
                raise HorovodInternalError(f"{what} failed: {_first_line(exc)}") from exc
            self._forget(future)
            return
        if work is not None and self._await_short(future, work, what):
            return
        done = threading.Event()
        self.link.add_waiter(done)
        try:
            future.add_done_callback(lambda _: done.set())
            if not wait_until(done, future.done, self.timeout_s, lambda: self._raise_if_over(what)):
                raise HorovodInternalError(
                    f"{what} did not complete within {self.timeout_s:g} s (--collective-timeout) in generation "
                    f"{self.generation}: a peer is hung or stopped"
                )
        finally:
            self.link.remove_waiter(done)
        try:
            future.wait()
        except RuntimeError as exc:
            raise HorovodInternalError(f"{what} failed in generation {self.generation}: {_first_line(exc)}") from exc
        self._forget(future)

    def _await_short(self, future: torch.futures.Future, work: dist.Work, what: str) -> bool:
        """Wait up to `SHORT_WAIT` for a Gloo collective in Gloo's own wait; True when it is done.
        Most collectives of an operation finish within it, and the wait through the future's
        callback and an event (below) cost 100-140 us more per collective (2 ranks: a small
        allgather 0.48 ms instead of 0.34 ms). A wait that runs out leaves the collective going
        (c10d's Work.wait raises "Operation timed out!" and nothing else); the rest of the wait
        is the usual one, woken at once by the generation-over signal."""
        try:
            work.wait(SHORT_WAIT)
        except RuntimeError as exc:
            if not work.is_completed():
                return False
            try:  # it failed, or finished just after the wait ran out
                work.wait()
            except RuntimeError as failed:
                raise HorovodInternalError(
                    f"{what} failed in generation {self.generation}: {_first_line(failed)}") from exc
        self._forget(future)
        return True

    def _forget(self, future: torch.futures.Future) -> None:
        """A collective waited for is no longer in flight: its future (which holds its tensors) is
        dropped at once, so a result the caller drops is free for `ResultPool` to reuse."""
        try:
            self._in_flight.remove(future)
        except ValueError:  # pruned meanwhile
            pass

    def _raise_if_over(self, what: str) -> None:
        assert self.link is not None
        reason = self.link.generation_over(self.generation)
        if reason:
            raise HorovodInternalError(f"{what} aborted: generation {self.generation} is over ({reason})")


class Pending:
    """A collective started with `Communicator.*_async_`; `wait()` once before using its tensor."""

    def __init__(self, comm: Communicator, started: torch.futures.Future | tuple[torch.futures.Future, Any] | None,
                 what: str) -> None:
        self.comm = comm
        self.future: torch.futures.Future | None
        self.work: Any
        self.future, self.work = started if isinstance(started, tuple) else (started, None)
        self.what = what

        self._after: list[Callable[[], Any]] = []

    def then(self, after: Callable[[], Any]) -> "Pending":
        """Run `after` once the collective is done (a result carried in another dtype copied back)."""
        self._after.append(after)
        return self

    def wait(self) -> None:
        if self.future is not None:
            self.comm._await(self.future, self.work, self.what)
        while self._after:
            self._after.pop(0)()


def gloo_device(toward: str | None) -> object:
    """The network device Gloo binds to: `GLOO_SOCKET_IFNAME`'s interface when set (horovodrun's
    --network-interface), else this host's address on the route to the ring store, which the
    other hosts reach too (Gloo's own default resolves the host name, which may name an address
    the others cannot dial)."""
    interface = os.environ.get(env_names.GLOO_SOCKET_IFNAME)
    if interface:
        if interface not in interface_names():
            raise NetworkError(f"{env_names.GLOO_SOCKET_IFNAME}={interface} (--network-interface): this host has no "
                               f"such interface (it has {', '.join(interface_names())}); name one that every host has")
        return dist.ProcessGroupGloo.create_device(interface=interface)
    if toward is None:
        return dist.ProcessGroupGloo.create_default_device()
    try:
        return dist.ProcessGroupGloo.create_device(hostname=route_address(toward))
    except NetworkError:
        return dist.ProcessGroupGloo.create_default_device()


def build_process_group(
    store: dist.Store, prefix: str, rank: int, size: int, timeout_s: float, backend: str,
    is_over: Callable[[], str | None], link: RendezvousLink | None, device: object | None = None,
) -> Ring:
    """Connect the ring of one generation on a fresh key prefix of the long-lived store.

    Construction blocks until every member has connected; it runs in a helper thread so that a
    member dying meanwhile (the rendezvous ends the generation) does not leave us waiting for
    the full timeout. An abandoned half-built group is simply dropped.
    """
    timeout = timedelta(seconds=timeout_s)

    def construct() -> Ring:
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            return dist.ProcessGroupNCCL(dist.PrefixStore(prefix + "nccl/", store), rank, size, options)
        if device is None:
            return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, timeout)
        gloo = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # the stubs lack it; torch has it
        gloo._timeout = timeout
        gloo._devices = [device]
        return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, gloo)

    if link is None or size == 1:
        return construct()
    result: dict[str, object] = {}
    done = threading.Event()

    def target() -> None:
        try:
            result["pg"] = construct()
        except Exception as exc:  # reported to the caller below
            result["error"] = exc
        done.set()

    def check_over() -> None:
        if is_over():
            raise HorovodInternalError(f"building the ring of {prefix!r} was abandoned: {is_over()}")

    link.add_waiter(done)
    try:
        threading.Thread(target=target, name="ringmaster-pg-init", daemon=True).start()
        wait_until(done, lambda: bool(result), timeout_s, check_over)
    finally:
        link.remove_waiter(done)
    if "pg" in result:
        return result["pg"]  # type: ignore[return-value]
    if "error" in result:
        raise HorovodInternalError(f"building the ring of {prefix!r} failed: {_first_line(result['error'])}")
    reason = is_over() or f"not every member connected within {timeout_s:g} s"
    raise HorovodInternalError(f"building the ring of {prefix!r} was abandoned: {reason}")


def _future_of(work: dist.Work) -> tuple[torch.futures.Future, bool]:
    """The work's future, and whether it is the work's own: Gloo's point-to-point works have
    none, so a helper thread waits (their wait with a timeout fails the transfer: never waited for briefly)."""
    try:
        return work.get_future(), True
    except RuntimeError:
        future: torch.futures.Future = torch.futures.Future()

        def wait() -> None:
            try:
                work.wait()
                future.set_result(None)
            except Exception as exc:  # handed to the waiting caller
                future.set_exception(exc)

        threading.Thread(target=wait, name="ringmaster-p2p-wait", daemon=True).start()
        return future, False


def wait_until(wake: threading.Event, finished: Callable[[], bool], timeout_s: float,
               check: Callable[[], None]) -> bool:
    """Wait until `finished()`; `check()` may raise on each wake-up. False on timeout."""
    deadline = time.monotonic() + timeout_s
    while not finished():
        check()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        wake.wait(remaining)
        wake.clear()
    return True


def _first_line(exc: object) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
