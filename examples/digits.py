"""A small convolutional network learns handwritten digits: the script `ringmaster demo` runs.

The data is scikit-learn's digits set (1,797 8x8 images of 0-9, shipped inside the package: no
download), split once with a fixed seed into 1,437 training and 360 test images. Written as a
Horovod elastic script: only the import line differs. Run it yourself with, for example,
`ringmaster run -np 2 python examples/digits.py`.

Rank 0 prints one JSON line per step (`step`, `epoch`, `loss`, `size`, `time`) and one per epoch
with the test accuracy: `ringmaster plot` draws them from the job's log.

`--global-batch-size B --micro-batch-size m` keeps the training independent of the world size
(what `ringmaster demo` runs): every step is the mean over the same B samples however many
workers share them, each worker accumulating its micro-batches; the loss printed is then the
step's loss over all B samples, so runs of any sizes can be compared step by step. Without it,
each worker takes `--batch-size` samples per step (Horovod's semantics: the global batch is
the batch times the world size).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn

import ringmaster.torch as hvd


def digits() -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """The training and test sets, the same on every worker (a fixed split)."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        sys.exit("examples/digits.py needs scikit-learn: pip install 'ringmaster[demo]'")
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    train_x, test_x, train_y, test_y = train_test_split(images, labels, test_size=360, random_state=0, stratify=labels)
    return (torch.utils.data.TensorDataset(train_x, train_y), torch.utils.data.TensorDataset(test_x, test_y))


def network() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def accuracy(model: nn.Module, test: torch.utils.data.TensorDataset) -> float:
    x, y = test.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def say(**record: object) -> None:
    """One JSON line on rank 0 (what `ringmaster plot` reads from the job's log)."""
    if hvd.rank() == 0:
        print(json.dumps({**record, "time": round(time.time(), 3)}), flush=True)


#: Longest wait before the last epoch (`--wait-before-last-epoch`), in half-second rounds.
WAIT_ROUNDS = 600


def wait_for_file(path: str, state: hvd.elastic.TorchState) -> None:
    """Wait until `path` exists on any worker (all decide together: an allreduce of what each
    sees), committing each round: a commit is where workers waiting to join come in. Says it
    waits (a `waiting` record), so that whoever waits for epochs to pass knows none will."""
    say(step=state.step, epoch=state.epoch, waiting=True)
    for _ in range(WAIT_ROUNDS):
        seen = hvd.allreduce(torch.tensor([float(os.path.exists(path))]), op=hvd.Max)
        if seen.item() > 0:
            return
        state.commit()
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16, help="per worker")
    parser.add_argument("--global-batch-size", type=int, default=None,
                        help="samples per step across all workers, whatever their number (with --micro-batch-size)")
    parser.add_argument("--micro-batch-size", type=int, default=None,
                        help="samples per forward and backward pass with --global-batch-size (default: --batch-size)")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hold", type=float, default=0.0,
                        help="seconds to stay up after training (so the job's dashboard can still be opened)")
    parser.add_argument("--wait-before-last-epoch", metavar="FILE", default=None,
                        help="before the last epoch, wait until FILE exists (at most 300 s), committing every half "
                             "second so that workers joining meanwhile join the last epoch (`ringmaster demo` "
                             "creates it after its last act)")
    args = parser.parse_args()

    torch.set_num_threads(1)  # several workers share this machine's cores
    hvd.init()
    torch.manual_seed(args.seed)
    train_set, test_set = digits()
    global_batch = args.global_batch_size is not None
    sampler = hvd.elastic.ElasticSampler(
        train_set,
        shuffle=True,
        seed=args.seed,
        global_batch_size=args.global_batch_size,
        micro_batch_size=(args.micro_batch_size or args.batch_size) if global_batch else None,
    )
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = network()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0)

    def global_step(micro_batches: list[list[int]]) -> float:
        """One optimizer step over this worker's micro-batches of the global batch (the
        optimizer accumulates them and averages over the whole batch); the step's loss over
        all B samples, before the update."""
        optimizer.zero_grad()
        summed = torch.zeros(1, dtype=torch.float64)
        for micro in micro_batches:
            data, target = train_set[micro]
            loss = nn.functional.cross_entropy(model(data), target)
            loss.backward()
            summed += loss.item() * len(micro)
        optimizer.step()
        return float(hvd.allreduce(summed, op=hvd.Sum)) / args.global_batch_size

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> float:
        while state.epoch < args.epochs:
            if args.wait_before_last_epoch and state.epoch == args.epochs - 1:
                wait_for_file(args.wait_before_last_epoch, state)
            if global_batch:
                for micro_batches in sampler.steps():
                    step_loss = global_step(micro_batches)
                    state.step += 1
                    sampler.record_step()
                    say(step=state.step, epoch=state.epoch, loss=float(f"{step_loss:.8g}"), size=hvd.size())
                    hvd.report(loss=step_loss)
                    state.commit()
            for batch_idx, (data, target) in enumerate(loader if not global_batch else ()):
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(data), target)
                loss.backward()
                optimizer.step()
                state.step += 1
                state.sampler.record_batch(batch_idx, args.batch_size)
                say(step=state.step, epoch=state.epoch, loss=round(loss.item(), 5), size=hvd.size())
                hvd.report(loss=loss)
                state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            say(step=state.step, epoch=state.epoch, accuracy=round(accuracy(model, test_set), 4), size=hvd.size())
            state.commit()
        return accuracy(model, test_set)

    final = train(state)
    say(done=True, step=state.step, accuracy=round(final, 4))
    if args.hold > 0:
        time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
