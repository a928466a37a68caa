"""The data path side by side in one run: DDP against Ringmaster's DistributedOptimizer.

2 ranks on this machine, Gloo, one thread each, the same models; the median time of a training
step (zero_grad, forward, backward, step) over the timed steps after warm-up, and samples/s
over both ranks, for
  - a compute floor: one process, no communication (the same step with a plain optimizer);
  - DDP (torch.nn.parallel.DistributedDataParallel, default buckets), raw torch.distributed,
    and DDP with its fp16 compression hook;
  - Ringmaster (`hvd.DistributedOptimizer` under `ringmaster run -np 2`), with
    `Compression.fp16`, and with `backward_passes_per_step=4` (per backward pass);
on an MLP of 1.3 M parameters, one of 25 M (100 MB of gradients), both batch 64, and a
ResNet-18-sized conv net (11.7 M parameters, written here: torchvision's wheel here is a CUDA
build) on 64x64 images, batch 16. Then allreduce throughput for 1, 16 and 64 MB:
`hvd.allreduce_` (in place), `hvd.allreduce` (Average, a new tensor) and raw
`torch.distributed.all_reduce`. Ranks must end with identical parameters (checked).

Run: python bench/datapath.py [--steps 10] [--models mlp-1.3m,mlp-25m,resnet-18]
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
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ("mlp-1.3m", "mlp-25m", "resnet-18")
WARMUP = 3
SIZES_MB = (1, 16, 64)
REPEATS = 5


def build(name: str) -> tuple[Any, Callable[[], Any], int]:
    """(model, make a batch, batch size) for a model name."""
    import torch

    torch.manual_seed(0)
    if name.startswith("mlp"):
        width, layers = {"mlp-1.3m": (800, 2), "mlp-25m": (2500, 4)}[name]
        mods: list[Any] = []
        for _ in range(layers):
            mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        return torch.nn.Sequential(*mods[:-1]), lambda: torch.randn(64, width), 64
    return resnet18(), lambda: torch.randn(16, 3, 64, 64), 16


def resnet18() -> Any:
    """ResNet-18's layout (11.7 M parameters), written out."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers)


def timed_steps(model: Any, optimizer: Any, batch: Callable[[], Any], steps: int, passes: int = 1) -> list[float]:
    """Seconds per backward pass of each timed step (a step is `passes` backward passes)."""
    x = batch()
    times = []
    for i in range(WARMUP + steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        for _ in range(passes):
            model(x).square().mean().backward()
        optimizer.step()
        if i >= WARMUP:
            times.append((time.perf_counter() - started) / passes)
    return times


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- baselines (raw torch)
def floor(name: str, steps: int) -> float:
    import torch

    torch.set_num_threads(1)
    model, batch, _ = build(name)
    return statistics.median(timed_steps(model, torch.optim.SGD(model.parameters(), lr=1e-4), batch, steps))


def _ddp_rank(rank: int, port: int, name: str, steps: int, fp16: bool, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model, batch, _ = build(name)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if fp16:
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    times = timed_steps(ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4), batch, steps)
    if rank == 0:
        pathlib.Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def _allreduce_rank(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    seconds = {}
    for mb in SIZES_MB:
        tensor = torch.ones(mb * (1 << 20) // 4)
        dist.all_reduce(tensor)
        samples = []
        for _ in range(REPEATS):
            started = time.perf_counter()
            dist.all_reduce(tensor)
            samples.append(time.perf_counter() - started)
        seconds[mb] = statistics.median(samples)
    if rank == 0:
        pathlib.Path(out).write_text(json.dumps(seconds))
    dist.destroy_process_group()


def spawn_two(target: Callable, *args: Any) -> Any:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(target, args=(_free_port(), *args, out), nprocs=2)
        return json.loads(pathlib.Path(out).read_text())


# ---------------------------------------------------------------- Ringmaster
def worker(mode: str, name: str, steps: int, compression: str, passes: int, out: str) -> None:
    import torch

    import ringmaster.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    if mode == "allreduce":
        seconds: dict[str, dict[int, float]] = {"in_place": {}, "average": {}}
        for mb in SIZES_MB:
            tensor = torch.ones(mb * (1 << 20) // 4)
            hvd.allreduce_(tensor, op=hvd.Sum)
            for kind, run in (("in_place", lambda: hvd.allreduce_(tensor, op=hvd.Sum)), ("average", lambda: hvd.allreduce(tensor))):
                samples = []
                for _ in range(REPEATS):
                    started = time.perf_counter()
                    run()
                    samples.append(time.perf_counter() - started)
                seconds[kind][mb] = statistics.median(samples)
        if hvd.rank() == 0:
            pathlib.Path(out).write_text(json.dumps(seconds))
        return
    model, batch, _ = build(name)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                         named_parameters=model.named_parameters(),
                                         compression=getattr(hvd.Compression, compression), backward_passes_per_step=passes)
    times = timed_steps(model, optimizer, batch, steps, passes)
    digest = hvd.allgather_object(float(sum(p.double().sum() for p in model.parameters())))
    if hvd.rank() == 0:
        pathlib.Path(out).write_text(json.dumps({"times": times, "digests": digest}))


def ringmaster(mode: str, name: str = "", steps: int = 0, compression: str = "none", passes: int = 1) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        subprocess.run([sys.executable, "-m", "ringmaster.cli", "run", "-np", "2", sys.executable, __file__, "--worker", mode,
                        "--model", name or "-", "--steps", str(steps), "--compression", compression, "--passes", str(passes),
                        "--out", out], cwd=ROOT, check=True, capture_output=True, timeout=900)
        result = json.loads(pathlib.Path(out).read_text())
        if mode == "allreduce":
            return result
        assert len(set(result["digests"])) == 1, f"ranks differ after {name}: {result['digests']}"
        return statistics.median(result["times"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--compression", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.steps, args.compression, args.passes, args.out)
        return
    print(f"2 ranks, Gloo, 1 thread each; median of {args.steps} steps after {WARMUP} warm-up; "
          "ms per step (per backward pass with bpps=4), samples/s over both ranks, ratio to DDP")
    header = ["floor", "DDP", "DDP fp16", "Ringmaster", "fp16", "bpps=4"]
    print(f"{'model':<10} " + " ".join(f"{h:>19}" for h in header))
    for name in args.models.split(","):
        batch = build(name)[2]
        base = statistics.median(spawn_two(_ddp_rank, name, args.steps, False))
        cells = {
            "floor": floor(name, args.steps),
            "DDP": base,
            "DDP fp16": statistics.median(spawn_two(_ddp_rank, name, args.steps, True)),
            "Ringmaster": ringmaster("train", name, args.steps),
            "fp16": ringmaster("train", name, args.steps, "fp16"),
            "bpps=4": ringmaster("train", name, args.steps, passes=4),
        }
        row = [f"{s * 1e3:6.1f} {2 * batch / s:6.0f}/s {s / base:4.2f}x" for s in cells.values()]
        print(f"{name:<10} " + " ".join(f"{c:>19}" for c in row), flush=True)
    raw = spawn_two(_allreduce_rank)
    ours = ringmaster("allreduce")
    print("\nallreduce of N MB (2 ranks, GB/s = N MB / median time): "
          "torch.distributed.all_reduce | hvd.allreduce_ (in place) | hvd.allreduce (Average, new tensor)")
    for mb in SIZES_MB:
        gbs = [mb / 1024 / t for t in (raw[str(mb)], ours["in_place"][str(mb)], ours["average"][str(mb)])]
        print(f"{mb:>3} MB  {gbs[0]:6.2f} GB/s  {gbs[1]:6.2f} GB/s ({gbs[1] / gbs[0]:4.2f}x)  "
              f"{gbs[2]:6.2f} GB/s ({gbs[2] / gbs[0]:4.2f}x)")


if __name__ == "__main__":
    main()
