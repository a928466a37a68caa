"""What a declared global batch costs: Ringmaster's accumulation against a hand-written loop of
the same micro-batches, side by side in one run.

One `ringmaster run -np N --spares 0` job (N = 2 by default; 3 gives uneven shares); in its
workers, in alternating blocks of steps so that every way sees the machine at the same moments:
  - hand-written: torch.distributed alone (its own `init_process_group("gloo")`): each rank runs
    its micro-batches of the step (the same ones as Ringmaster's: `global_batch.GlobalBatch`),
    autograd accumulating into `.grad`, then one `all_reduce` (sum) of the flattened gradients,
    divided by the step's micro-batches, and the optimizer's step;
  - Ringmaster, exact (the default): `ElasticSampler(global_batch_size=B, micro_batch_size=m)`,
    `steps()`, `record_step()`, a `DistributedOptimizer` set by `TorchState`: float64 sums,
    the same bits at any world size;
  - Ringmaster, `exact=False`: the same, summed in float32.
Each way trains its own copy of the same model (momentum SGD). Figures: the median step time
per way (ms) and its ratio to the hand-written loop's, for an MLP of 1.3 M parameters
(micro-batches of 32, B = 256) and a small conv net (`examples/digits.py`'s, 8x8 images,
micro-batches of 16, B = 64).

Run: python bench/global_batch.py [--np 2] [--steps 40]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from datapath import _ddp_group  # noqa: E402 (this folder's: a plain torch.distributed group beside Ringmaster's)

MODELS = {"mlp-1.3m": (256, 32), "conv": (64, 16)}  # name -> (global batch, micro-batch)
WAYS = ("hand-written", "exact", "inexact")
BLOCK = 5  # steps per block; a way's first step in a block is not timed
SAMPLES = 4096


def build(name: str) -> tuple[Any, Any, Any]:
    """(model, inputs, targets) for a model name, the same on every rank."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "mlp-1.3m":
        model = nn.Sequential(nn.Linear(256, 800), nn.ReLU(), nn.Linear(800, 800), nn.ReLU(), nn.Linear(800, 10))
        inputs = torch.randn(SAMPLES, 256)
    else:
        sys.path.insert(0, str(ROOT / "examples"))
        from digits import network

        model = network()
        inputs = torch.randn(SAMPLES, 1, 8, 8)
    return model, inputs, torch.randint(0, 10, (SAMPLES,))


def worker(name: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import ringmaster.torch as hvd
    from ringmaster.worker.train.global_batch import GlobalBatch

    torch.set_num_threads(1)
    hvd.init()
    _ddp_group()
    global_batch, micro = MODELS[name]
    deal = GlobalBatch(global_batch, micro)
    model, inputs, targets = build(name)
    loss_fn = nn.CrossEntropyLoss()

    def hand_written() -> Callable[[], None]:
        own = copy.deepcopy(model)
        optimizer = torch.optim.SGD(own.parameters(), lr=0.01, momentum=0.9)
        params = list(own.parameters())
        order = list(range(SAMPLES))
        state = {"step": 0}

        def step() -> None:
            optimizer.zero_grad()
            for m in deal.micro_batches_of(order, state["step"] % deal.steps_per_epoch(SAMPLES), dist.get_rank(),
                                           dist.get_world_size()):
                loss_fn(own(inputs[m]), targets[m]).backward()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.flatten() for g in grads])
            dist.all_reduce(flat)
            flat /= deal.micro_batches
            offset = 0
            for p in params:
                p.grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            optimizer.step()
            state["step"] += 1
        return step

    def ringmaster(exact: bool) -> Callable[[], None]:
        own = copy.deepcopy(model)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(own.parameters(), lr=0.01, momentum=0.9),
                                             named_parameters=own.named_parameters())
        sampler = hvd.elastic.ElasticSampler(inputs, shuffle=False, global_batch_size=global_batch,
                                             micro_batch_size=micro, exact=exact)
        state = hvd.elastic.TorchState(own, optimizer, sampler=sampler)
        state.reset()
        steps_left: Iterator[list[list[int]]] = iter(())

        def step() -> None:
            nonlocal steps_left
            micro_batches = next(steps_left, None)
            if micro_batches is None:
                sampler.set_epoch(sampler.epoch + 1)
                state.reset()
                steps_left = sampler.steps()
                micro_batches = next(steps_left)
            optimizer.zero_grad()
            for m in micro_batches:
                loss_fn(own(inputs[m]), targets[m]).backward()
            optimizer.step()
            sampler.record_step()
        return step

    ways = {"hand-written": hand_written(), "exact": ringmaster(True), "inexact": ringmaster(False)}
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    while min(len(t) for t in times.values()) < steps:
        for way in WAYS:
            for i in range(BLOCK):
                hvd.allreduce(torch.zeros(1), name="bench.align")  # (every rank starts the step together)
                started = time.perf_counter()
                ways[way]()
                if i:
                    times[way].append(time.perf_counter() - started)
    if hvd.rank() == 0:
        pathlib.Path(out).write_text(json.dumps({way: statistics.median(t) for way, t in times.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per way")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.out)
        return
    print(f"{args.np} ranks, Gloo, 1 thread each, the ways alternating in the same processes; median of {args.steps} "
          "steps; ms per step (ratio to the hand-written loop)")
    print(f"{'model':<10} {'B / micro':>10} " + " ".join(f"{w:>22}" for w in WAYS))
    for name, (global_batch, micro) in MODELS.items():
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            subprocess.run([sys.executable, "-m", "ringmaster.cli", "run", "-np", str(args.np), "--spares", "0",
                            sys.executable, __file__, "--worker", name, "--steps", str(args.steps), "--out", out],
                           cwd=ROOT, check=True, capture_output=True, timeout=1800)
            medians = json.loads(pathlib.Path(out).read_text())
        base = medians["hand-written"]
        cells = [f"{medians[w] * 1e3:8.1f} ms ({medians[w] / base:4.2f}x)" for w in WAYS]
        print(f"{name:<10} {f'{global_batch} / {micro}':>10} " + " ".join(f"{c:>22}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
