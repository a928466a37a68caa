"""What a commit costs, next to what Horovod does and to the machine's plain copy, in one run.

Part 1, for states of 10 MB, 100 MB and 1 GB (a stack of 1024x1024 linear layers):
  - Ringmaster: `TorchState.commit()` (tensors into reused host buffers), median of repeats,
    and the first commit (which allocates the buffers);
  - Horovod: `copy.deepcopy(model.state_dict())`, what Horovod's `TorchState.save()` does;
  - plain: one `torch` tensor copy of the same bytes into a preallocated tensor (the bandwidth
    a commit can hope for);
  - a commit when a durable checkpoint is due (the staging copy the training thread pays; the
    disk write happens on the writer thread).
Part 2: step time of the example model (examples/train.py: Linear(1,1), SGD, ElasticSampler,
batch 16) and of a 3-layer 1024-wide MLP, without commits, committing every 10 steps and every
step.

A job of one worker (no rendezvous): the commit's host-update check, one 8-byte allreduce in a
real job, is not part of these figures.

With `--device cuda` the models live on the GPU: a commit copies them to host memory (the GPU
holds nothing more), Horovod's deepcopy makes a second copy on the GPU, and the plain copy is one
device-to-host copy into pinned memory; "GPU memory held" is what each leaves allocated there.

Run: python bench/commit.py [--repeats 5] [--sizes 10,100,1000] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import copy
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

for name in list(os.environ):
    if name.startswith("RINGMASTER_"):
        del os.environ[name]

import torch  # noqa: E402

import ringmaster.torch as hvd  # noqa: E402

LAYER_BYTES = (1024 * 1024 + 1024) * 4
#: where the models live (the command line's --device)
DEVICE = torch.device("cpu")


def synchronize() -> None:
    """Wait for the GPU's queued work, so that a timing covers it (nothing on the CPU)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def gpu_bytes() -> int:
    return torch.cuda.memory_allocated() if DEVICE.type == "cuda" else 0


def stack_of_layers(megabytes: int) -> torch.nn.Module:
    layers = max(1, round(megabytes * 1e6 / LAYER_BYTES))
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(layers)]).to(DEVICE)


def nbytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def timed(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def commit_figures(megabytes: int, repeats: int) -> None:
    model = stack_of_layers(megabytes)
    size = nbytes(model)
    gb = size / 1e9
    repeats = max(repeats, min(200, int(1e9 / size)))  # small states: enough repeats for a stable median

    synchronize()
    before = gpu_bytes()
    started = time.perf_counter()
    state = hvd.elastic.TorchState(model=model)  # construction takes the first snapshot: it allocates
    synchronize()
    first = time.perf_counter() - started
    commit = timed(state.commit, repeats)
    held = gpu_bytes() - before

    before = gpu_bytes()
    copies: list = []

    def deepcopy_once() -> None:  # (the copy is kept, as Horovod keeps it, until the next replaces it)
        copies.clear()
        copies.append(copy.deepcopy(model.state_dict()))

    horovod = timed(deepcopy_once, repeats)
    horovod_held = gpu_bytes() - before
    copies.clear()

    source = torch.empty(size // 4, device=DEVICE)
    source.copy_(torch.randn(1024, device=DEVICE).repeat(size // 4 // 1024 + 1)[: size // 4])
    target = torch.empty(size // 4, pin_memory=DEVICE.type == "cuda")
    target.copy_(source)  # touched once, like reused commit buffers
    plain = timed(lambda: target.copy_(source), repeats)
    source = target = torch.empty(0)  # free the copies before the next part

    with tempfile.TemporaryDirectory() as folder:
        os.environ["RINGMASTER_CHECKPOINT_DIR"] = folder
        os.environ["RINGMASTER_CHECKPOINT_EVERY"] = "1"
        durable = hvd.elastic.TorchState(model=model)
        durable.commit()  # allocates the staging buffers
        durable._durable.writer.flush(600)  # type: ignore[union-attr]
        staged = []
        for _ in range(repeats):
            durable._durable.writer.flush(600)  # type: ignore[union-attr]  # so each commit stages one
            started = time.perf_counter()
            durable.commit()
            staged.append(time.perf_counter() - started)
        written = durable._durable.writer.written  # type: ignore[union-attr]
        durable._durable.writer.flush(600)  # type: ignore[union-attr]
        del os.environ["RINGMASTER_CHECKPOINT_DIR"], os.environ["RINGMASTER_CHECKPOINT_EVERY"]
    due = statistics.median(staged)

    print(f"{size / 1e6:8.0f} MB | commit {commit * 1e3:8.1f} ms {gb / commit:6.1f} GB/s | first commit "
          f"{first * 1e3:8.1f} ms | deepcopy (Horovod) {horovod * 1e3:8.1f} ms {gb / horovod:6.1f} GB/s | plain copy "
          f"{plain * 1e3:7.1f} ms {gb / plain:6.1f} GB/s | commit/plain {plain / commit:4.0%} of plain bandwidth | "
          f"commit with checkpoint due {due * 1e3:8.1f} ms ({len(written)} written)"
          + (f" | GPU memory held: commit {held / 1e6:.0f} MB, deepcopy {horovod_held / 1e6:.0f} MB"
             if DEVICE.type == "cuda" else ""), flush=True)


def step_figures(name: str, model: torch.nn.Module, inputs: int, steps: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(4096, inputs, device=DEVICE)
    y = torch.randn(4096, 1 if inputs == 1 else inputs, device=DEVICE)
    dataset = torch.utils.data.TensorDataset(x, y)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
    runs: dict[int, list[float]] = {0: [], 10: [], 1: []}
    for _ in range(3):  # interleaved rounds, best of each: warm-up and noise hit all alike
        for every in runs:
            sampler.set_epoch(0)
            batches = iter(loader)
            for _ in range(10):  # warm up
                data, target = next(batches)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(data), target).backward()
                optimizer.step()
            started = time.perf_counter()
            for i in range(steps):
                data, target = next(batches)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(data), target).backward()
                optimizer.step()
                sampler.record_batch(i + 10, 16)
                if every and (i + 1) % every == 0:
                    state.commit()
            synchronize()
            runs[every].append((time.perf_counter() - started) / steps)
    results = {every: min(times) for every, times in runs.items()}
    base = results[0]
    print(f"{name:>28} | step {base * 1e3:7.3f} ms | commit every 10 steps {results[10] * 1e3:7.3f} ms "
          f"({(results[10] / base - 1):+.1%}) | every step {results[1] * 1e3:7.3f} ms ({(results[1] / base - 1):+.1%})",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="10,100,1000", help="state sizes in MB")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the models live")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device (torch.cuda.is_available() is False)")
    hvd.init()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CUDA: {torch.cuda.is_available()}, "
          f"models on {DEVICE}" + (f" ({torch.cuda.get_device_name()})" if DEVICE.type == "cuda" else ""))
    print("Part 1: commit of a model's state")
    for megabytes in (int(s) for s in args.sizes.split(",")):
        commit_figures(megabytes, args.repeats)
    print("Part 2: step time (job of one)")
    step_figures("example model (Linear(1,1))", torch.nn.Linear(1, 1).to(DEVICE), 1, args.steps)
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(),
                              torch.nn.Linear(1024, 1024)).to(DEVICE)
    step_figures("MLP 3x1024 (12.6 MB)", mlp, 1024, args.steps // 4)


if __name__ == "__main__":
    main()
