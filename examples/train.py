"""A small elastic training job: a linear model learns y = 3x - 1 from a synthetic data set.

Run it with `ringmaster run -np 2 python examples/train.py` (or with a discovery script).
Written as a Horovod elastic script: only the import line differs.
"""

from __future__ import annotations

import argparse
import sys

import torch

import ringmaster.torch as hvd


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, args.samples).unsqueeze(1)
    dataset = torch.utils.data.TensorDataset(x, 3 * x - 1 + 0.01 * torch.randn_like(x))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = torch.nn.Linear(1, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> float:
        loss = torch.tensor(0.0)
        while state.epoch < args.epochs:
            for batch_idx, (data, target) in enumerate(loader):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(data), target)
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, args.batch_size)
                state.commit()
                hvd.report(loss=loss)  # the job's status, dashboard and metrics show it
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: loss {loss.item():.5f} on {hvd.size()} workers", flush=True)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()
        return loss.item()

    final = train(state)
    if hvd.rank() == 0:
        w, b = model.weight.item(), model.bias.item()
        print(f"done: y = {w:.3f} x + {b:.3f} (loss {final:.5f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
