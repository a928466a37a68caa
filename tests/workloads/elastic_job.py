"""Training workload for the end-to-end tests: a Horovod elastic script with a log.

Written in Horovod's documented elastic style: the learning rate scales with the world size and
a reset callback registered with `state.register_reset_callbacks` sets it again after every
reset (`--lr-callback`); momentum SGD or Adam (`--optimizer`); a learning-rate scheduler stepped
per epoch and kept in the state (`--scheduler`); `ElasticSampler`; a commit every
`--commit-every` steps; plain attributes.

Every worker appends JSON lines to `<log-dir>/<worker id>.jsonl`:
  {"event": "synced", "generation", "rank", "size", "step", "epoch", "left", "checksum", "digest", "lr",
   "threads"}
      each time training (re-)enters, after the sync and the reset callbacks (`left`: samples of
      the epoch still to deal out; `threads`: torch's intra-op threads in this worker)
  {"event": "commit", "generation", "rank", "size", "step"}              after each commit
  {"event": "epoch", "epoch", "min", "max", "total", "samples"}  rank 0, at the end of each epoch:
      how often each sample of the epoch reached the committed model (exactly once means
      min == max == 1), and how many reached it in all; written before the commit that ends
      the epoch, so a rollback to its last step writes it again
  {"event": "done", "step", "epochs", "checksum", "digest", "loss", "size", "rank", "ringmaster"}  when training
      returned (`ringmaster`: the file `ringmaster.torch` was imported from: which install ran it)
`seen` counts samples through an allreduce into the state, so it records exactly what the
committed model has seen, across rollbacks and resizes. `digest` is a SHA-256 of the whole
training state (module tensors, optimizer state and every hyperparameter, scheduler, sampler
progress, plain attributes), computed here independently of Ringmaster: equal digests mean
bit-identical replicas. `loss` is the final model's loss over the whole data set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import resource
import time
from typing import Any, cast

import torch

import ringmaster.torch as hvd

BASE_LR = 0.01
GAMMA = 0.7  # the scheduler's decay per epoch


def checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.state_dict().values()))


def _canonical(value: Any) -> Any:
    """Plain, exactly comparable form: tensors as (dtype, shape, values), dicts sorted."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return ("tensor", str(t.dtype), tuple(t.shape),
                t.double().flatten().tolist() if t.is_floating_point() else t.flatten().tolist())
    if isinstance(value, dict):
        return ("dict", sorted((repr(k), _canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_canonical(v) for v in value])
    return (type(value).__name__, repr(value))


def state_digest(parts: dict[str, Any]) -> str:
    return hashlib.sha256(repr(_canonical(parts)).encode()).hexdigest()[:16]


class HeadFirst(torch.nn.Module):
    """The same network with its output layer declared before the hidden one: its gradients
    become ready in another order than the declaration suggests, so buckets are rebuilt after
    the first step of every generation (and newcomers must agree with the survivors on them)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.head = torch.nn.Linear(hidden, 1)
        self.body = torch.nn.Linear(4, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x)))


class RankStamp:
    """Takes the rank of the process that loads it: state that no sync can make equal."""

    def __init__(self) -> None:
        self.rank = hvd.rank()

    def __setstate__(self, state: dict) -> None:
        self.rank = hvd.rank()


def hold_the_gil(seconds: float) -> None:
    """About `seconds` in one C call that never releases the GIL (`sum` over a range runs in C,
    no bytecode in between), sized by a short measured run of the same call."""
    started = time.perf_counter()
    sum(range(1_000_000))
    per_million = max(time.perf_counter() - started, 1e-4)
    sum(range(int(seconds / per_million * 1_000_000)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--step-time", type=float, default=0.05, help="simulated compute per step")
    parser.add_argument("--optimizer", choices=["sgd", "momentum", "adam"], default="sgd")
    parser.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none",
                        help="gradient compression (fp16/bf16 buckets of 256 KiB and more go around the "
                             "half-precision ring)")
    parser.add_argument("--base-lr", type=float, default=BASE_LR, help="learning rate of a ring of one")
    parser.add_argument("--lr-callback", action="store_true",
                        help="lr = base lr x world size, set again by a reset callback after every reset (Horovod's "
                             "style)")
    parser.add_argument("--scheduler", action="store_true", help="StepLR stepped per epoch, kept in the state")
    parser.add_argument("--commit-every", type=int, default=1, help="steps between commits")
    parser.add_argument("--skew-callback", action="store_true",
                        help="fault injection: the reset callback makes the lr depend on the rank (the replica guard "
                             "heals it)")
    parser.add_argument("--rank-stamp", action="store_true",
                        help="fault injection: a plain attribute that takes the rank of whoever loads it (cannot be "
                             "synced)")
    parser.add_argument("--timestamps", action="store_true", help="add wall-clock times (for benchmarks)")
    parser.add_argument("--stop-file", default=None, help="end training at the end of the epoch in which this file "
                                                          "appears")
    parser.add_argument("--file-size-limit-at-step", type=int, default=None, metavar="N",
                        help="fault injection: from step N on, rank 0 may not write files over 256 KiB (RLIMIT_FSIZE: "
                             "the kernel fails larger writes with EFBIG, as a full disk fails them with ENOSPC)")
    parser.add_argument("--hidden", type=int, default=8, help="width of the model's hidden layer")
    parser.add_argument("--head-first", action="store_true", help="declare the output layer first (see HeadFirst)")
    parser.add_argument("--die-in-backward-at", type=int, default=None, metavar="STEP",
                        help="the last rank of generation 1 exits (code 1) inside backward at this step, after the "
                             "later layers' gradient buckets went out (with a small HOROVOD_FUSION_THRESHOLD) and "
                             "once every other rank is inside that step's backward too")
    parser.add_argument("--newcomer-delay", type=float, default=0.0, metavar="S",
                        help="a worker started as a newcomer (to join a running job) waits this long first (a slow "
                             "model build)")
    parser.add_argument("--busy-start", type=float, default=0.0, metavar="S",
                        help="a worker of the first generation spends about S s in one C call that holds the GIL "
                             "between hvd.init() and hvd.elastic.run (its heartbeat thread cannot run), as a large "
                             "json.loads or an extension's build does")
    parser.add_argument("--ballast-mb", type=float, default=0.0, help="extra tensor state (makes checkpoints this "
                                                                      "large)")
    args = parser.parse_args()

    if os.environ.get("RINGMASTER_GENERATION") == "0":
        time.sleep(args.newcomer_delay)  # (the simulated cost itself, not a wait for something)
    hvd.init()
    worker_id = os.environ.get("RINGMASTER_WORKER_ID", "local").replace("/", "_")
    log_path = os.path.join(args.log_dir, f"{worker_id}.jsonl")

    def log(**record) -> None:
        if args.timestamps:
            record["time"] = time.time()
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    if args.busy_start and os.environ.get("RINGMASTER_GENERATION") == "1":
        log(event="busy_start", pid=os.getpid())
        hold_the_gil(args.busy_start)
        log(event="busy_end")
    data = torch.Generator().manual_seed(99)
    features = torch.randn(args.samples, 4, generator=data)
    targets = features @ torch.tensor([[1.5], [-2.0], [0.5],
                                       [1.0]]) + 0.3 + 0.05 * torch.randn(args.samples, 1, generator=data)
    dataset = torch.utils.data.TensorDataset(torch.arange(args.samples), features, targets)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(1234)
    model: torch.nn.Module = (HeadFirst(args.hidden) if args.head_first else
                              torch.nn.Sequential(torch.nn.Linear(4, args.hidden), torch.nn.Tanh(),
                                                  torch.nn.Linear(args.hidden, 1)))
    lr = args.base_lr * (hvd.size() if args.lr_callback else 1)
    if args.optimizer == "adam":
        base: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        base = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9 if args.optimizer == "momentum" else 0.0)
    optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                         compression=getattr(hvd.Compression, args.compression))
    extra: dict[str, Any] = {}
    if args.scheduler:
        extra["scheduler"] = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
    if args.rank_stamp:
        extra["stamp"] = RankStamp()
    state = hvd.elastic.TorchState(
        model=model,
        optimizer=optimizer,
        sampler=sampler,
        epoch=0,
        last_epoch=args.epochs,
        step=0,
        seen=torch.zeros(args.samples),
        ballast=torch.zeros(int(args.ballast_mb * (1 << 18))),
        **extra,
    )

    def digest() -> str:
        parts: dict[str, Any] = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                 "sampler": sampler.state_dict(), "epoch": state.epoch,
                                 "step": state.step, "seen": state.seen}
        if args.scheduler:
            parts["scheduler"] = state.scheduler.state_dict()
        return state_digest(parts)

    def on_reset() -> None:
        if args.lr_callback:
            for group in optimizer.param_groups:
                group["lr"] = args.base_lr * hvd.size() * (GAMMA ** state.epoch if args.scheduler else 1.0)
        if args.skew_callback:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * (1 + 0.01 * hvd.rank())
        log(event="reset", size=hvd.size(), rank=hvd.rank(),
            grads_cleared=all(p.grad is None for p in model.parameters()))

    state.register_reset_callbacks([on_reset])

    if args.die_in_backward_at is not None:
        def dying_step() -> bool:
            return hvd.context().assignment.generation == 1 and state.step + 1 == args.die_in_backward_at

        def in_backward(rank: int) -> pathlib.Path:
            return pathlib.Path(args.log_dir) / f"in-backward-{rank}"

        def say_in_backward(param: torch.Tensor) -> None:
            # The other ranks say they are inside the dying step's backward (their buckets going
            # out): a rank still finishing the step before would fail there instead, with that
            # step's gradients reduced whole, and the test would not see a step dropped mid-flight.
            if dying_step() and hvd.rank() != hvd.size() - 1:
                in_backward(hvd.rank()).touch()

        def die_mid_backward(grad: torch.Tensor) -> None:  # the first layer's gradient comes last
            if dying_step() and hvd.rank() == hvd.size() - 1:
                others = [in_backward(r) for r in range(hvd.size() - 1)]
                deadline = time.monotonic() + 60
                while not all(p.exists() for p in others) and time.monotonic() < deadline:
                    time.sleep(0.01)  # (polling the others' word, with a deadline)
                log(event="dying", step=state.step + 1, in_flight=getattr(optimizer, "_hvd_buckets").in_flight,
                    ring_sum=hvd.context().communicator()._ring_sum is not None,
                    others_in_backward=all(p.exists() for p in others))
                os._exit(1)
        first_layer: Any = model.body if isinstance(model, HeadFirst) else cast(torch.nn.Sequential, model)[0]
        for param in model.parameters():
            if param is not first_layer.weight:
                param.register_post_accumulate_grad_hook(say_in_backward)
        # A hook on the gradient itself runs before it is accumulated, so before the optimizer
        # hears it is ready: this rank never starts the first layer's bucket, and the others'
        # allreduce of it cannot complete (hooked after accumulation, it ran after the bucket
        # had gone out, and the whole step could complete on every rank before the exit).
        first_layer.weight.register_hook(die_mid_backward)

    def full_loss() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(features), targets))

    @hvd.elastic.run
    def train(state) -> None:
        generation = hvd.context().assignment.generation
        log(event="synced", generation=generation, rank=hvd.rank(), size=hvd.size(), step=state.step, epoch=state.epoch,
            left=len(sampler.remaining_indices), checksum=checksum(model), digest=digest(),
            lr=optimizer.param_groups[0]["lr"],
            threads=torch.get_num_threads(), group=hvd.elastic.replica_group().index,
            group_size=hvd.elastic.replica_group().size)
        while state.epoch < state.last_epoch:
            for batch_idx, (index, x, y) in enumerate(loader):
                if args.timestamps:
                    log(event="begin", step=state.step + 1)
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                hvd.report(loss=loss)  # for the job's metrics and status
                counts = torch.zeros(args.samples)
                counts[index] += 1
                state.seen += hvd.allreduce(counts, op=hvd.Sum)
                time.sleep(args.step_time)
                state.step += 1
                state.sampler.record_batch(batch_idx, args.batch_size)
                if (args.file_size_limit_at_step is not None and state.step == args.file_size_limit_at_step
                        and hvd.rank() == 0):
                    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
                    log(event="fault", step=state.step)
                if state.step % args.commit_every == 0:
                    state.commit()
                    log(event="commit", generation=generation, rank=hvd.rank(), size=hvd.size(), step=state.step)
            if hvd.rank() == 0:
                log(event="epoch", epoch=state.epoch, min=float(state.seen.min()), max=float(state.seen.max()),
                    total=float(state.seen.sum()), samples=args.samples)
            state.epoch += 1
            state.seen = torch.zeros(args.samples)
            state.sampler.set_epoch(state.epoch)
            if args.scheduler:
                state.scheduler.step()
            if args.stop_file is not None:
                stop = hvd.allreduce(torch.tensor([float(os.path.exists(args.stop_file))]), op=hvd.Max)
                if stop.item() > 0:
                    state.last_epoch = state.epoch  # every rank agrees (and commits it): this was the last epoch
            state.commit()

    train(state)
    log(event="done", step=state.step, epochs=state.epoch, checksum=checksum(model), digest=digest(), loss=full_loss(),
        size=hvd.size(), rank=hvd.rank(), ringmaster=hvd.__file__)


if __name__ == "__main__":
    main()
