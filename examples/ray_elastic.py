"""The smallest elastic job on Ray: a linear model learns y = 3x - 1, under `ElasticRayExecutor`.

Run it against a Ray cluster (`RAY_ADDRESS`, or `--address`), or with neither on a Ray started
here for the purpose (one node, a worker per CPU):

    pip install 'ringmaster[ray]'
    python examples/ray_elastic.py --workers 1:4

Add or remove nodes while it trains: the job grows at its next commit and shrinks without losing
a commit. The training function is a Horovod elastic one: only the import line differs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def train(epochs: int, samples: int = 2048, batch_size: int = 16, lr: float = 0.05) -> dict:
    """What every worker runs."""
    import torch

    import ringmaster.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, samples).unsqueeze(1)
    dataset = torch.utils.data.TensorDataset(x, 3 * x - 1 + 0.01 * torch.randn_like(x))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    model = torch.nn.Linear(1, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def loop(state: hvd.elastic.TorchState) -> float:
        loss = torch.tensor(0.0)
        while state.epoch < epochs:
            for batch_idx, (data, target) in enumerate(loader):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(data), target)
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, batch_size)
                state.commit()
                hvd.report(loss=loss)
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: loss {loss.item():.5f} on {hvd.size()} workers", flush=True)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()
        return loss.item()

    final = loop(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "loss": final,
            "weight": model.weight.item(), "bias": model.bias.item()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="the Ray cluster (default: $RAY_ADDRESS, else a Ray started here)")
    parser.add_argument("--workers", default="1:4", metavar="MIN:MAX", help="fewest and most workers (default: 1:4)")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    try:
        low, _, high = args.workers.partition(":")
        min_workers, max_workers = int(low), int(high or low)
    except ValueError:
        parser.error(f"--workers {args.workers!r}: give MIN:MAX, e.g. 1:4")

    import ray

    from ringmaster.ray import ElasticRayExecutor, RayJobFailed

    ray.init(address=args.address, logging_level=logging.WARNING)
    executor = ElasticRayExecutor(min_workers=min_workers, max_workers=max_workers)
    try:
        executor.start()
        results = executor.run(train, kwargs={"epochs": args.epochs})
    except RayJobFailed as exc:
        print(f"the job failed: {exc}", file=sys.stderr)
        return 1
    finally:
        executor.shutdown()
        ray.shutdown()
    first = results[0]
    print(f"done on {first['size']} workers: y = {first['weight']:.3f} x + {first['bias']:.3f} "
          f"(loss {first['loss']:.5f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
