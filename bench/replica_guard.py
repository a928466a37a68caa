"""What the replica guard adds to a reset, next to the sync that precedes it, in one run.

For training states of about 10 MB and 100 MB (a stack of 1024x1024 linear layers with Adam:
weights, biases and two moment buffers), on a real 2-rank Gloo ring on this machine:
  - guard: hash every entry of the live state (XXH3 over every byte; canonical walk of the
    objects) and compare the digests in one allgather, as `State.verify_replicas` does after
    every sync;
  - sync fingerprint: the commit's fingerprint and its allgather (what the sync pays when the
    ranks already agree, e.g. after a failure);
  - baseline: one plain tensor copy of the same bytes (what a commit of that state costs).
Median of the slowest rank over repeats.

Run: python bench/replica_guard.py [--repeats 7] [--sizes 10,100]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pathlib
import socket
import statistics
import sys
import time
from datetime import timedelta

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _state(megabytes: int):
    import torch

    torch.manual_seed(0)
    layers = max(1, round(megabytes * (1 << 20) / (3 * 4 * (1024 * 1024 + 1024))))
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 1024)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3, "batch": 17}


def _rank_main(rank: int, port: int, sizes: list[int], repeats: int, results) -> None:
    import torch
    import torch.distributed as dist

    from ringmaster.checkpoint.memory import HostSnapshot
    from ringmaster.worker.train.collectives import Communicator
    from ringmaster.worker.train.replica_guard import compare_live_state
    from ringmaster.worker.train.state_sync import fingerprint

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    comm = Communicator(dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=60)), rank, 2, 1, None, 60.0)
    for megabytes in sizes:
        entries = _state(megabytes)
        snapshot = HostSnapshot()
        snapshot.capture(entries)
        flat = torch.cat([b.reshape(-1).view(torch.uint8) for b in snapshot.buffers])
        copy_into = torch.empty_like(flat)
        figures: dict[str, list[float]] = {"guard": [], "fingerprint": [], "copy": []}
        for _ in range(repeats):
            comm.barrier()
            started = time.perf_counter()
            assert not compare_live_state(entries, comm)
            figures["guard"].append(time.perf_counter() - started)
            comm.barrier()
            started = time.perf_counter()
            comm.allgather(torch.tensor((*fingerprint(snapshot), 0), dtype=torch.int64))
            figures["fingerprint"].append(time.perf_counter() - started)
            started = time.perf_counter()
            copy_into.copy_(flat)
            figures["copy"].append(time.perf_counter() - started)
        results.put((rank, megabytes, snapshot.nbytes, {k: statistics.median(v) for k, v in figures.items()}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", default="10,100", help="state sizes in MB")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(rank, port, sizes, args.repeats, results)) for rank in range(2)]
    for p in procs:
        p.start()
    rows: dict[int, dict[str, float]] = {}
    nbytes: dict[int, int] = {}
    try:
        for _ in range(2 * len(sizes)):
            rank, megabytes, size, figures = results.get(timeout=600)
            nbytes[megabytes] = size
            slowest = rows.setdefault(megabytes, {})
            for key, value in figures.items():
                slowest[key] = max(slowest.get(key, 0.0), value)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    print("2 ranks, Gloo on loopback, median of the slowest rank")
    print("| state | replica guard (hash + allgather) | sync fingerprint + allgather | plain copy of the state |")
    print("| --- | --- | --- | --- |")
    for megabytes in sizes:
        r = rows[megabytes]
        gb = nbytes[megabytes] / 1e9
        print(f"| {nbytes[megabytes] / 1e6:.0f} MB | {r['guard'] * 1e3:.1f} ms ({gb / r['guard']:.1f} GB/s) | "
              f"{r['fingerprint'] * 1e3:.1f} ms | {r['copy'] * 1e3:.1f} ms |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
