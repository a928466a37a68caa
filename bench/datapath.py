"""The data path side by side in one run: DDP against Ringmaster's DistributedOptimizer.

2 ranks on this machine, Gloo, one thread each, the same models. Every way of training runs in
the same two processes (workers of one `ringmaster run -np 2 --spares 0` job per model), in
alternating blocks of steps, so that each way sees the same machine at the same moments (on 2
busy cores, separate runs differ by 20% and more from one minute to the next):
  - DDP (torch.nn.parallel.DistributedDataParallel, default buckets, on its own
    `init_process_group("gloo")`), and DDP with its fp16 compression hook;
  - Ringmaster (`hvd.DistributedOptimizer`), with `Compression.fp16`, `Compression.bf16`, and with
    `backward_passes_per_step=4` (per backward pass);
and a compute floor: one process, no communication (the same step with a plain optimizer).
The median time of a training step (zero_grad, forward, backward, step) over the timed steps,
samples/s over both ranks, on an MLP of 1.3 M parameters, one of 25 M (100 MB of gradients),
both batch 64, and a ResNet-18-sized conv net (11.7 M parameters, written here: torchvision's
wheel here is a CUDA build) on 64x64 images, batch 16. Then allreduce throughput for 1, 16 and
64 MB, alternating in the same processes too: `hvd.allreduce_` (in place) against raw
`torch.distributed.all_reduce`, and `hvd.allreduce` (Average, a new tensor) against the same
with torch.distributed alone (clone, all_reduce, div_): torch's way copies the whole input before
a byte goes out (and a new tensor of over 32 MB is fresh memory from the kernel each time: page
faults), where `hvd.allreduce` sums from the input straight into a pooled result. Ranks must end
with identical parameters (checked for every way). Then Horovod's other collectives against
torch.distributed's on the same processes (`hvd.allgather` / `all_gather_into_tensor`,
`hvd.reducescatter` / `reduce_scatter_tensor`, `hvd.alltoall` / `all_to_all_single`; 1, 16 and
64 MB per rank; at 1 MB also Horovod's call with its data sent only after its round), and how much of 8 allreduces of 4
MB started before some compute it hides (`hvd.allreduce_async_` + `synchronize` against `all_reduce(async_op=True)` +
`wait`), and small operations (8 values per rank: what a script averages or gathers each step) of each kind.
`--spares 0`: a warm spare importing torch beside the job would take a core from it for a few seconds.

Run: python bench/datapath.py [--steps 60] [--models mlp-1.3m,mlp-25m,resnet-18]
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
REPEATS = 20


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

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                               nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers)


def one_step(model: Any, optimizer: Any, x: Any, passes: int = 1) -> float:
    """Seconds of one training step per backward pass (a step is `passes` backward passes)."""
    started = time.perf_counter()
    optimizer.zero_grad()
    for _ in range(passes):
        model(x).square().mean().backward()
    optimizer.step()
    return (time.perf_counter() - started) / passes


def floor(name: str, steps: int) -> float:
    """The compute alone: one process, a plain optimizer."""
    import torch

    torch.set_num_threads(1)
    model, batch, _ = build(name)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = batch()
    times = [one_step(model, optimizer, x) for _ in range(WARMUP + steps)]
    return statistics.median(times[WARMUP:])


#: The ways of training compared, in the order printed: (name, DDP?, compression, passes per step).
WAYS = (("DDP", True, "", 1), ("DDP fp16", True, "fp16", 1), ("Ringmaster", False, "none", 1),
        ("fp16", False, "fp16", 1), ("bf16", False, "bf16", 1), ("bpps=4", False, "none", 4))
#: Steps per block; a way's first step in a block is not timed (the others' buffers were in cache).
BLOCK = 5


def _ddp_group() -> None:
    """A plain torch.distributed group beside Ringmaster's rings, on a port rank 0 chose."""
    import torch.distributed as dist

    import ringmaster.torch as hvd

    port = hvd.broadcast_object(_free_port() if hvd.rank() == 0 else 0, root_rank=0)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # this group hosts its own store
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size())


def worker(mode: str, name: str, steps: int, out: str) -> None:
    import copy

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import ringmaster.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    _ddp_group()
    if mode == "allreduce":
        _allreduce(out)
        dist.destroy_process_group()
        return
    base, batch, _ = build(name)
    x = batch()
    ways = []
    for label, ddp, compression, passes in WAYS:
        model = copy.deepcopy(base)
        if ddp:
            model = torch.nn.parallel.DistributedDataParallel(model)
            if compression == "fp16":
                model.register_comm_hook(None, default_hooks.fp16_compress_hook)
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        else:
            optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                                 named_parameters=model.named_parameters(),
                                                 compression=getattr(hvd.Compression, compression),
                                                 backward_passes_per_step=passes)
        ways.append((label, model, optimizer, passes))
    times: dict[str, list[float]] = {label: [] for label, *_ in ways}
    for block in range(max(1, -(-steps // (BLOCK - 1)))):
        order = ways if block % 2 == 0 else ways[::-1]
        for label, model, optimizer, passes in order:
            for i in range(BLOCK):
                seconds = one_step(model, optimizer, x, passes)
                if i:
                    times[label].append(seconds)
    digests = {label: hvd.allgather_object(float(sum(p.double().sum() for p in model.parameters())))
               for label, model, _, _ in ways}
    if hvd.rank() == 0:
        pathlib.Path(out).write_text(json.dumps({"times": times, "digests": digests}))
    dist.destroy_process_group()


def _allreduce(out: str) -> None:
    """GB/s of the three allreduces, alternating on the same tensors."""
    import torch
    import torch.distributed as dist

    import ringmaster.torch as hvd

    seconds: dict[str, Any] = {"raw": {}, "in_place": {}, "average": {}, "raw_average": {}}
    for mb in SIZES_MB:
        tensor = torch.ones(mb * (1 << 20) // 4)

        def raw_average() -> Any:  # an average as a new tensor with torch.distributed alone
            out = tensor.clone()
            dist.all_reduce(out)
            return out.div_(hvd.size())

        runs = {"raw": lambda: dist.all_reduce(tensor), "in_place": lambda: hvd.allreduce_(tensor, op=hvd.Sum),
                "average": lambda: hvd.allreduce(tensor), "raw_average": raw_average}
        samples = _alternating(runs)
        for kind in runs:
            seconds[kind][mb] = statistics.median(samples[kind])
    seconds.update(_other_collectives())
    seconds["small"] = _small_operations()
    seconds["overlap"] = _overlap()
    if hvd.rank() == 0:
        pathlib.Path(out).write_text(json.dumps(seconds))


def _alternating(runs: dict[str, Callable[[], Any]], repeats: int = REPEATS) -> dict[str, list[float]]:
    """Seconds of each run, `repeats` times after one warm-up, in alternating order (so each sees
    the machine at the same moments)."""
    samples: dict[str, list[float]] = {kind: [] for kind in runs}
    for repeat in range(1 + repeats):
        for kind, run in (runs.items() if repeat % 2 else reversed(runs.items())):
            started = time.perf_counter()
            run()
            if repeat:
                samples[kind].append(time.perf_counter() - started)
    return samples


def _other_collectives() -> dict[str, dict[int, float]]:
    """Median seconds of allgather, reducescatter and alltoall of N MB per rank, Horovod's calls
    against torch.distributed's on the same two processes, alternating."""
    import torch
    import torch.distributed as dist

    import ringmaster.torch as hvd
    from ringmaster.torch.process_sets import ring_of

    queue = ring_of(None).ops

    def after_round(run: Callable[[], Any]) -> Callable[[], Any]:
        """`run` with its data sent only once its round agreed (as before early data)."""
        def late() -> Any:
            queue.sends_early = False
            try:
                return run()
            finally:
                queue.sends_early = True
        return late

    n = hvd.size()
    seconds: dict[str, dict[int, float]] = {}
    for mb in SIZES_MB:
        part = torch.ones(mb * (1 << 20) // 4)
        whole = torch.ones(n * part.numel())
        gathered, scattered, swapped = torch.empty_like(whole), torch.empty_like(part), torch.empty_like(part)
        runs = {
            "dist_allgather": lambda: dist.all_gather_into_tensor(gathered, part),
            "hvd_allgather": lambda: hvd.allgather(part),
            "dist_reducescatter": lambda: dist.reduce_scatter_tensor(scattered, whole),
            "hvd_reducescatter": lambda: hvd.reducescatter(whole, op=hvd.Sum),
            "dist_alltoall": lambda: dist.all_to_all_single(swapped, part),
            "hvd_alltoall": lambda: hvd.alltoall(part),
        }
        if mb == 1:  # (larger ones send after their round anyway)
            runs.update({f"late_{op}": after_round(runs[f"hvd_{op}"]) for op in ("allgather", "reducescatter",
                                                                                 "alltoall")})
        samples = _alternating(runs)
        for kind in runs:
            seconds.setdefault(kind, {})[mb] = statistics.median(samples[kind])
    return seconds


#: The small operations timed (`_small_operations`): per rank, 8 float32 values (a metric or two).
SMALL_ELEMENTS = 8


def _small_operations() -> dict[str, float]:
    """Median seconds of small operations (what a script averages each step: a loss, a count),
    Horovod's call (carried in its negotiation round) against torch.distributed's, alternating.
    torch.distributed's write into tensors made once; Horovod's give new ones, as Horovod does."""
    import torch
    import torch.distributed as dist

    import ringmaster.torch as hvd

    n = hvd.size()
    part = torch.ones(SMALL_ELEMENTS)
    gathered, swapped, root = torch.empty(n * SMALL_ELEMENTS), torch.empty(SMALL_ELEMENTS), torch.ones(SMALL_ELEMENTS)
    runs = {
        "dist_allreduce": lambda: dist.all_reduce(part),
        "hvd_allreduce": lambda: hvd.allreduce(part),
        "dist_allgather": lambda: dist.all_gather_into_tensor(gathered, part),
        "hvd_allgather": lambda: hvd.allgather(part),
        "dist_broadcast": lambda: dist.broadcast(root, 0),
        "hvd_broadcast": lambda: hvd.broadcast(root, 0),
        "dist_alltoall": lambda: dist.all_to_all_single(swapped, part),
        "hvd_alltoall": lambda: hvd.alltoall(part),
        "dist_barrier": lambda: dist.barrier(),
        "hvd_barrier": lambda: hvd.barrier(),
    }
    samples = _alternating(runs, repeats=10 * REPEATS)
    return {kind: statistics.median(samples[kind]) for kind in runs}


def _overlap() -> dict[str, float]:
    """How much of 8 allreduces of 4 MB hides behind compute: median seconds of compute alone,
    of the allreduces alone, and of both with the allreduces started first (torch.distributed's
    `async_op=True` against `hvd.allreduce_async_` + `synchronize`)."""
    import torch
    import torch.distributed as dist

    import ringmaster.torch as hvd

    tensors = [torch.ones(1 << 20) for _ in range(8)]
    a = torch.randn(384, 384)

    def compute() -> None:
        for _ in range(12):
            torch.mm(a, a)

    def dist_both() -> None:
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        compute()
        for w in works:
            w.wait()

    def hvd_both() -> None:
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"overlap.{i}") for i, t in enumerate(tensors)]
        compute()
        for h in handles:
            hvd.synchronize(h)

    runs = {"compute": compute, "dist_comm": lambda: [dist.all_reduce(t) for t in tensors],
            "hvd_comm": lambda: [hvd.allreduce_(t, op=hvd.Sum) for t in tensors], "dist_both": dist_both,
            "hvd_both": hvd_both}
    samples = _alternating(runs)
    return {kind: statistics.median(values) for kind, values in samples.items()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ringmaster(mode: str, name: str = "", steps: int = 0) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        subprocess.run([sys.executable, "-m", "ringmaster.cli", "run",
                        "-np", "2", "--spares", "0", sys.executable, __file__,
                        "--worker", mode, "--model", name or "-", "--steps", str(steps), "--out", out],
                       cwd=ROOT, check=True, capture_output=True, timeout=1800)
        return json.loads(pathlib.Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="timed steps per way")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.steps, args.out)
        return
    print(f"2 ranks, Gloo, 1 thread each, every way in the same two processes in alternating blocks; median of "
          f"{args.steps} steps; ms per step (per backward pass with bpps=4), samples/s over both ranks, ratio to DDP")
    header = ["floor", *(label for label, *_ in WAYS)]
    print(f"{'model':<10} " + " ".join(f"{h:>19}" for h in header))
    for name in [m for m in args.models.split(",") if m]:  # --models "": the allreduces only
        batch = build(name)[2]
        result = ringmaster("train", name, args.steps)
        for label, digests in result["digests"].items():
            assert len(set(digests)) == 1, f"ranks differ after {name} ({label}): {digests}"
        cells = {"floor": floor(name, args.steps),
                 **{label: statistics.median(t) for label, t in result["times"].items()}}
        base = cells["DDP"]
        row = [f"{s * 1e3:6.1f} {2 * batch / s:6.0f}/s {s / base:4.2f}x" for s in cells.values()]
        print(f"{name:<10} " + " ".join(f"{c:>19}" for c in row), flush=True)
    ours = ringmaster("allreduce")
    print("\nallreduce of N MB (2 ranks, GB/s = N MB / median time, alternating; ratios to all_reduce in place):\n"
          "        all_reduce (in place) | hvd.allreduce_ (in place) | torch average as a new tensor "
          "(clone, all_reduce, div_) | hvd.allreduce (Average, new tensor)")
    for mb in SIZES_MB:
        gbs = [mb / 1024 / ours[kind][str(mb)] for kind in ("raw", "in_place", "raw_average", "average")]
        print(f"{mb:>3} MB  {gbs[0]:6.2f} GB/s  " + "  ".join(f"{g:6.2f} GB/s ({g / gbs[0]:4.2f}x)" for g in gbs[1:]))
    print("\nN MB per rank, median ms: torch.distributed | Horovod's call here (time ratio, goal <= 1.05x)")
    for mb in SIZES_MB:
        compared: list[str] = []
        for op in ("allgather", "reducescatter", "alltoall"):
            ours_s, theirs_s = ours[f"hvd_{op}"][str(mb)], ours[f"dist_{op}"][str(mb)]
            compared.append(f"{op} {theirs_s * 1e3:7.2f} | {ours_s * 1e3:7.2f} ({ours_s / theirs_s:4.2f}x)")
        print(f"{mb:>3} MB  " + "   ".join(compared))
    late = {op: ours[f"late_{op}"]["1"] / ours[f"dist_{op}"]["1"] for op in ("allgather", "reducescatter", "alltoall")}
    print("  (1 MB with the data sent only after the round agreed, RINGMASTER_EARLY_DATA=0: "
          + ", ".join(f"{op} {ratio:4.2f}x" for op, ratio in late.items()) + ")")
    small = ours["small"]
    print(f"\nsmall operations ({SMALL_ELEMENTS} float32 per rank), median ms: torch.distributed | Horovod's call here "
          "(time ratio)")
    print("  " + "   ".join(f"{op} {small[f'dist_{op}'] * 1e3:5.3f} | {small[f'hvd_{op}'] * 1e3:5.3f} "
                            f"({small[f'hvd_{op}'] / small[f'dist_{op}']:4.2f}x)"
                            for op in ("allreduce", "allgather", "broadcast", "alltoall", "barrier")))
    o = ours["overlap"]
    hidden = {k: (o["compute"] + o[f"{k}_comm"] - o[f"{k}_both"]) / min(o["compute"], o[f"{k}_comm"]) for k in ("dist",
                                                                                                                "hvd")}
    print(f"\noverlap, 8 allreduces of 4 MB started before {o['compute'] * 1e3:.1f} ms of compute: torch.distributed "
          f"async_op {o['dist_both'] * 1e3:.1f} ms (alone {o['dist_comm'] * 1e3:.1f} ms, {hidden['dist']:.0%} hidden) "
          f"| hvd.allreduce_async_ {o['hvd_both'] * 1e3:.1f} ms (alone {o['hvd_comm'] * 1e3:.1f} ms, "
          f"{hidden['hvd']:.0%} hidden); with the compute {o['hvd_both'] / o['dist_both']:.2f}x torch.distributed's "
          "time (hvd's 'alone' issues each allreduce_ and waits: one agreement round each, so a share over 100% is "
          "the async calls' shared rounds and back-to-back starts)")


if __name__ == "__main__":
    main()
