"""Horovod's op API on a real job, as a Horovod user calls it; each rank writes what it saw.

    horovod_ops.py api OUT        every op name, async handles, process sets, errors, re-init
    horovod_ops.py async-kill OUT rank 1 dies while the others' async allgather and allreduce are in flight
    horovod_ops.py sets OUT STEPS an elastic loop using two process sets through resets (until
                                  STEPS, or until OUT/stop exists)
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import time

import torch

import ringmaster.torch as hvd


def _write(out: pathlib.Path, name: str, result: dict) -> None:
    tmp = out / f"{name}.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out / f"{name}.json")


def _error(call) -> str:
    try:
        call()
    except Exception as exc:  # the type and message are the result
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def api(out: pathlib.Path) -> None:
    hvd.init(process_sets=[hvd.ProcessSet([0, 2])])
    rank, size = hvd.rank(), hvd.size()
    r: dict = {"rank": rank, "size": size}
    r["probes"] = [hvd.gloo_built(), hvd.gloo_enabled(), hvd.mpi_built(), hvd.mpi_enabled(), hvd.ccl_built(),
                   hvd.ddl_built(), hvd.nccl_built(), hvd.cuda_built(), hvd.rocm_built()]
    r["mpi_threads"] = _error(hvd.mpi_threads_supported)
    r["int_prescale"] = hvd.allreduce(torch.tensor([3, 5], dtype=torch.int32), op=hvd.Sum, prescale_factor=0.5).tolist()
    r["product"] = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Product).tolist()
    r["min_int8"] = hvd.allreduce(torch.tensor([rank - 1], dtype=torch.int8), op=hvd.Min).tolist()
    # async: several in flight at once, polled, then synchronized out of order
    handles = [hvd.allreduce_async(torch.full((3,), float(rank + k)), name=f"grad.{k}", op=hvd.Sum) for k in range(8)]
    # a name issued again while its first operation is in flight: the second is refused. (Not
    # "grad.0": whether that one is still in flight here differs by rank, and a rank that queued
    # the duplicate would issue one collective more than the others.)
    r["duplicate_name"] = _error(lambda: [hvd.allreduce_async(torch.ones(1), name="twice") for _ in range(3)])
    r["async"] = [hvd.synchronize(h).tolist() for h in reversed(handles)]
    r["poll_after"] = _error(lambda: hvd.poll(handles[0]))
    h = hvd.allreduce_async_(torch.ones(2) * rank, op=hvd.Max)
    deadline = time.monotonic() + 60
    while not hvd.poll(h):  # Horovod's polling loop, as scripts write it (bounded here)
        assert time.monotonic() < deadline, "the polled allreduce never finished"
    r["polled"] = hvd.synchronize(h).tolist()
    r["allgather_async"] = hvd.synchronize(hvd.allgather_async(torch.full((rank + 1,), rank))).tolist()
    r["broadcast_async"] = hvd.synchronize(hvd.broadcast_async(torch.tensor([rank]), root_rank=1)).tolist()
    bcast = torch.tensor([rank * 1.0])
    hvd.synchronize(hvd.broadcast_async_(bcast, root_rank=2))
    r["broadcast_async_"] = bcast.tolist()
    r["grouped_async"] = [t.tolist() for t in hvd.synchronize(
        hvd.grouped_allreduce_async([torch.ones(2), torch.tensor([rank])], op=hvd.Sum))]
    # alltoall: rank r sends j+1 rows to rank j
    splits = [j + 1 for j in range(size)]
    rows = torch.tensor([[rank, j] for j in range(size) for _ in range(j + 1)])
    got, received = hvd.alltoall(rows, splits=splits)
    r["alltoall"] = got.tolist()
    r["alltoall_received"] = received.tolist()
    r["alltoall_even"] = hvd.alltoall(torch.arange(size) + 10 * rank).tolist()
    r["alltoall_async"] = [t.tolist() for t in hvd.synchronize(hvd.alltoall_async(rows, splits=splits))]
    r["reducescatter"] = hvd.reducescatter(torch.arange(7.0) + rank, op=hvd.Sum).tolist()
    r["reducescatter_avg"] = hvd.synchronize(hvd.reducescatter_async(torch.full((6,), float(rank)))).tolist()
    r["grouped_reducescatter"] = [t.tolist() for t in hvd.grouped_reducescatter([torch.ones(3), torch.ones(4, 2)],
                                                                                 op=hvd.Sum)]
    r["grouped_allgather"] = [t.tolist() for t in hvd.grouped_allgather([torch.tensor([rank]), torch.ones(rank, 2)])]
    # gradients flow through the collectives, as in Horovod
    x = torch.tensor([float(rank + 1)], requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * (rank + 1)).sum().backward()
    r["allreduce_grad"] = x.grad.tolist()
    y = torch.ones(2, requires_grad=True)
    hvd.allgather(y * (rank + 1)).sum().backward()
    r["allgather_grad"] = y.grad.tolist()
    # errors: on every rank, the ring usable after
    r["mismatch"] = _error(lambda: hvd.allreduce(torch.ones(2 + rank)))
    r["after_mismatch"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).tolist()
    r["bad_splits"] = _error(lambda: hvd.alltoall(torch.arange(5), splits=[9] * size))
    r["bad_op"] = _error(lambda: hvd.allreduce(torch.ones(1), op="median"))
    # process sets: one given to init, one added, one that does not fit, one removed
    r["duplicate_set"] = _error(lambda: hvd.add_process_set([0, 2]))
    first = hvd.add_process_set(hvd.ProcessSet([0, 1]))
    r["set_ids"] = [hvd.global_process_set.process_set_id, first.process_set_id]
    r["set_str"] = str(first)
    too_big = hvd.add_process_set([0, size])
    r["set_too_big"] = _error(lambda: hvd.allreduce(torch.ones(1), process_set=too_big))
    if rank in (0, 1):
        r["set_sum"] = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, process_set=first).tolist()
        r["set_rank"] = [first.rank(), first.size(), first.included()]
        r["set_bcast"] = hvd.broadcast(torch.tensor([rank]), root_rank=1, process_set=first).tolist()
        r["set_async"] = hvd.synchronize(hvd.allgather_async(torch.tensor([rank]), process_set=first)).tolist()
    else:
        r["not_member"] = _error(lambda: hvd.allreduce(torch.ones(1), process_set=first))
        r["set_rank"] = [_error(first.rank), first.size(), first.included()]
    r["removed"] = [hvd.remove_process_set(first), first.process_set_id, hvd.remove_process_set(first)]
    r["removed_use"] = _error(lambda: hvd.allreduce(torch.ones(1), process_set=first))
    hvd.barrier()
    hvd.barrier(process_set=hvd.global_process_set)
    r["barrier_set"] = True
    # SyncBatchNorm against torch's BatchNorm over the whole batch (every rank's part)
    torch.manual_seed(0)
    full = torch.randn(size * 4, 3, 5)
    part = full[rank * 4: (rank + 1) * 4].clone().requires_grad_(True)
    sync_bn, plain = hvd.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        sync_bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        plain.weight.copy_(sync_bn.weight)
    reference_input = full.clone().requires_grad_(True)
    expected = plain(reference_input)
    got_bn = sync_bn(part)
    r["syncbn_error"] = float((got_bn - expected[rank * 4: (rank + 1) * 4]).abs().max())
    got_bn.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    r["syncbn_grad_error"] = float((part.grad - reference_input.grad[rank * 4: (rank + 1) * 4]).abs().max())
    r["syncbn_running_error"] = float((sync_bn.running_var - plain.running_var).abs().max()
                                      + (sync_bn.running_mean - plain.running_mean).abs().max())
    # the timeline (rank 0 writes it)
    timeline = out / "timeline.json"
    hvd.start_timeline(str(timeline))
    hvd.allreduce(torch.ones(4), name="timed")
    hvd.stop_timeline()
    if rank == 0:
        r["timeline_names"] = sorted({e["tid"] for e in json.loads(timeline.read_text())["traceEvents"]})
    r["timeline_bad_folder"] = _error(lambda: hvd.start_timeline("/no/such/folder/t.json"))
    # shutdown and init again, ten times, the ring working each time
    sums: list[str | float] = []
    for _ in range(10):
        hvd.shutdown()
        assert not hvd.is_initialized()
        sums.append(_error(lambda: hvd.allreduce(torch.ones(1))))
        hvd.init()
        sums.append(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
    r["reinit"] = sums
    r["sets_after_shutdown"] = _error(lambda: hvd.allreduce(torch.ones(1), process_set=too_big))
    _write(out, str(rank), r)


def async_kill(out: pathlib.Path) -> None:
    hvd.init()
    rank = hvd.rank()
    hvd.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    # an allgather past the round's inline bytes (its data goes out during its round), then an allreduce
    handles = [hvd.allgather_async(torch.ones(4096), name="early.in.flight"),
               hvd.allreduce_async(torch.ones(1000), name="in.flight")]
    outcomes = []
    for handle in handles:
        try:
            hvd.synchronize(handle)
            outcomes.append("no error")
        except Exception as exc:  # the type is the result
            outcomes.append(type(exc).__name__)
    _write(out, str(rank), {"outcomes": outcomes, "seconds": time.monotonic() - started})


def sets(out: pathlib.Path, steps: int) -> None:
    """Each step: a sum over the set [0, 1] and over [0, 2]; each rank logs what each gave."""
    low, spread = hvd.ProcessSet([0, 1]), hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[low, spread])
    log = (out / f"{os.environ.get('RINGMASTER_WORKER_ID', 'w').replace('/', '-')}.log").open("a")
    state = hvd.elastic.ObjectState(step=0)

    @hvd.elastic.run
    def train(state) -> None:
        while state.step < steps:
            rank, size = hvd.rank(), hvd.size()
            record: dict = {"step": state.step, "rank": rank, "size": size}
            for name, process_set in (("low", low), ("spread", spread)):
                if rank not in (process_set.ranks or []):
                    continue
                try:
                    record[name] = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, process_set=process_set).item()
                except ValueError as exc:
                    record[name] = f"ValueError: {exc}"
            stop = hvd.allreduce(torch.tensor([float((out / "stop").exists())]), op=hvd.Max).item()  # the step's own
            time.sleep(0.05)  # the step's simulated compute (paces the loop; no synchronisation)
            log.write(json.dumps(record) + "\n")
            log.flush()
            state.step += 1
            state.commit()
            if stop:
                return

    train(state)
    log.close()


if __name__ == "__main__":
    mode, folder = sys.argv[1], pathlib.Path(sys.argv[2])
    if mode == "api":
        api(folder)
    elif mode == "async-kill":
        async_kill(folder)
    else:
        sets(folder, int(sys.argv[3]))
