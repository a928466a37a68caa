"""A training job whose scaling is set by its arguments, for the scheduling and straggler tests and
benches: `--params` sets the model's size (what each step's allreduce carries; its compute is one small
sample), `--wait` a step's
fixed cost that runs in parallel on every worker (input pipeline, a device's compute: it scales
perfectly), `--compute` a step's CPU work (a matrix product chain, single-threaded: it slows down
for real on a host whose CPU share is cut). The per-worker batch is kept, as Horovod scripts do.

Rank 0 appends a JSON line per commit to `--commit-log`: {"step", "time", "size", "generation"}.
Trains `--steps` steps or `--samples` samples (committed), then exits; or forever without either.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import ringmaster.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--samples", type=int, default=0,
                        help="or train until this many samples (a worker's batch is one) have been seen, so that more "
                             "workers finish sooner, as with a data set of that size")
    parser.add_argument("--params", type=int, default=1000, help="model parameters (the allreduce's size)")
    parser.add_argument("--wait", type=float, default=0.0, help="seconds of a step that run in parallel")
    parser.add_argument("--compute", type=int, default=0, help="matrix products of 128x128 per step (CPU)")
    parser.add_argument("--commit-every", type=int, default=1)
    parser.add_argument("--commit-log", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(args.params, 1, bias=False)  # (its gradient is dense: the allreduce carries all of it)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-6),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0, seen=0)
    square = torch.randn(128, 128) / 12.0
    data = torch.zeros(1, args.params)
    data[0, :1000] = torch.randn(min(1000, args.params))  # (little compute however large the model)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while (args.steps == 0 or state.step < args.steps) and (args.samples == 0 or state.seen < args.samples):
            optimizer.zero_grad()
            if args.wait:
                time.sleep(args.wait)  # (the step's cost itself: what runs in parallel on every worker)
            product = square
            for _ in range(args.compute):
                product = product @ square
            loss = model(data).pow(2).mean() + 0.0 * product.sum()
            loss.backward()
            optimizer.step()
            state.step += 1
            state.seen += hvd.size()
            if state.step % args.commit_every == 0:
                state.commit()
                if hvd.rank() == 0 and args.commit_log:
                    with open(args.commit_log, "a") as log:
                        log.write(json.dumps({"step": state.step, "time": time.time(), "size": hvd.size(),
                                              "generation": int(os.environ.get("RINGMASTER_GENERATION", "0"))}) + "\n")

    train(state)


if __name__ == "__main__":
    main()
