"""The data path side by side in one run: DDP against Ringmaster's DistributedOptimizer.

2 ranks on this machine, Gloo, one thread each, the same MLPs, batch 64: the median step time
(zero_grad, forward, backward, step) over the timed steps after warm-up, for
  - DDP (torch.nn.parallel.DistributedDataParallel, default buckets), raw torch.distributed;
  - Ringmaster (`hvd.DistributedOptimizer` under `ringmaster run -np 2`), and with
    `Compression.fp16`.
Ranks must end with identical parameters (checked for Ringmaster).

Run: python bench/datapath.py [--steps 10] [--models mlp-1.3m,mlp-25m]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = {"mlp-1.3m": (800, 2), "mlp-25m": (2500, 4)}  # width, layers (width^2 weights each)
BATCH = 64
WARMUP = 3


def build(name: str):
    import torch

    width, layers = MODELS[name]
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1]), width


def timed_steps(model, optimizer, width: int, steps: int, forward=None) -> list[float]:
    import torch

    x = torch.randn(BATCH, width)
    times = []
    for i in range(WARMUP + steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        (forward or model)(x).square().mean().backward()
        optimizer.step()
        if i >= WARMUP:
            times.append(time.perf_counter() - started)
    return times


# ---------------------------------------------------------------- DDP
def _ddp_rank(rank: int, port: int, name: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model, width = build(name)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    times = timed_steps(ddp, optimizer, width, steps)
    if rank == 0:
        pathlib.Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def ddp(name: str, steps: int) -> float:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        out = os.path.join(tmp, "times.json")
        mp.spawn(_ddp_rank, args=(port, name, steps, out), nprocs=2)
        return statistics.median(json.loads(pathlib.Path(out).read_text()))


# ---------------------------------------------------------------- Ringmaster
def worker(name: str, steps: int, compression: str, out: str) -> None:
    import torch

    import ringmaster.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    model, width = build(name)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                         named_parameters=model.named_parameters(),
                                         compression=getattr(hvd.Compression, compression))
    times = timed_steps(model, optimizer, width, steps)
    digest = hvd.allgather_object(float(sum(p.double().sum() for p in model.parameters())))
    if hvd.rank() == 0:
        pathlib.Path(out).write_text(json.dumps({"times": times, "digests": digest}))


def ringmaster(name: str, steps: int, compression: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        subprocess.run([sys.executable, "-m", "ringmaster.cli", "run", "-np", "2", sys.executable, __file__, "--worker",
                        "--model", name, "--steps", str(steps), "--compression", compression, "--out", out],
                       cwd=ROOT, check=True, capture_output=True, timeout=600)
        result = json.loads(pathlib.Path(out).read_text())
        assert len(set(result["digests"])) == 1, f"ranks differ after {name}: {result['digests']}"
        return statistics.median(result["times"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--compression", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.model, args.steps, args.compression, args.out)
        return
    print(f"2 ranks, Gloo, 1 thread each, batch {BATCH}, median of {args.steps} steps after {WARMUP} warm-up")
    print(f"{'model':<10} {'DDP ms':>8} {'Ringmaster ms':>14} {'ratio':>6} {'fp16 ms':>8} {'ratio':>6}")
    for name in args.models.split(","):
        base = ddp(name, args.steps)
        ours = ringmaster(name, args.steps, "none")
        half = ringmaster(name, args.steps, "fp16")
        print(f"{name:<10} {base * 1e3:8.1f} {ours * 1e3:14.1f} {ours / base:5.2f}x {half * 1e3:8.1f} {half / base:5.2f}x")


if __name__ == "__main__":
    main()
