"""Training workload with a declared global batch (`ElasticSampler(global_batch_size=B,
micro_batch_size=m)`): every optimizer step is the mean over the same B samples at any world size.

A small regression MLP, momentum SGD (its momentum committed with the model) with a learning
rate that decays per global step (a scheduler in the state), the data set
made from a fixed seed, the model from another: two runs of this script, whatever their world
sizes, resizes and rollbacks, should follow one trajectory up to floating-point reduction order.

Every worker appends JSON lines to `<log-dir>/<worker id>.jsonl`:
  {"event": "commit", "step", "epoch", "size", "rank", "group", "loss", "params", "micro"}  after each
      commit: the global step just committed (1-based, across epochs), the mean loss over its B
      samples before the update (every rank's micro-batches summed through an allreduce),
      the model's parameters after it (a flat list), and this rank's micro-batches of it
  {"event": "done", "step", "size", "rank"}  when training returned
With `--die-mid-step S`, the last rank of the first generation exits (code 1) at step S after
its first micro-batch's backward: a rollback in the middle of an accumulation.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import torch

import ringmaster.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--samples", type=int, default=192)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--micro-batch", type=int, default=3)
    parser.add_argument("--by", choices=("rank", "group"), default="rank")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many global steps")
    parser.add_argument("--stop-file", default=None, help="stop at the first commit after this file appears")
    parser.add_argument("--step-time", type=float, default=0.0, help="simulated compute per step")
    parser.add_argument("--die-mid-step", type=int, default=None, metavar="S")
    parser.add_argument("--inexact", action="store_true", help="sum the step's gradients in float32 (exact=False)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    hvd.init()
    log_path = pathlib.Path(args.log_dir) / f"{os.environ.get('RINGMASTER_WORKER_ID', 'local').replace('/', '_')}.jsonl"

    def log(**record) -> None:
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    data = torch.Generator().manual_seed(99)
    features = torch.randn(args.samples, 4, generator=data)
    targets = torch.sin(features @ torch.tensor([[1.5], [-2.0], [0.5], [1.0]])) + 0.05 * torch.randn(args.samples, 1,
                                                                                                     generator=data)
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(features, seed=7, by=args.by, global_batch_size=args.global_batch,
                                         micro_batch_size=args.micro_batch, exact=not args.inexact)
    # The learning rate decays per global step (a scheduler kept in the state): a resize changes
    # neither the step count nor the rate.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + 0.002 * step))
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, scheduler=scheduler, epoch=0,
                                   step=0, stopping=False)

    def stop() -> bool:
        return (args.steps is not None and state.step >= args.steps) or state.stopping

    def dies_now(step: int) -> bool:
        return (args.die_mid_step == step and hvd.context().assignment.generation == 1
                and hvd.rank() == hvd.size() - 1)

    @hvd.elastic.run
    def train(state) -> None:
        while not stop():
            for micro_batches in sampler.steps():
                optimizer.zero_grad()
                loss_sum = torch.zeros(1, dtype=torch.float64)
                for number, micro in enumerate(micro_batches):
                    loss = torch.nn.functional.mse_loss(model(features[micro]), targets[micro])
                    loss.backward()
                    loss_sum += loss.item() * len(micro)
                    if number == 0 and dies_now(state.step + 1):
                        log(event="dying", step=state.step + 1, micro_batches=len(micro_batches))
                        os._exit(1)
                optimizer.step()
                scheduler.step()
                # The loss summed over the ring, and whether any rank saw the stop file: every
                # rank then stops after the same step.
                seen_stop = args.stop_file is not None and os.path.exists(args.stop_file)
                summed = hvd.allreduce(torch.cat([loss_sum, torch.tensor([float(seen_stop)], dtype=torch.float64)]),
                                       op=hvd.Sum)
                step_loss = float(summed[0]) / args.global_batch
                if args.by == "group":
                    step_loss /= hvd.size() // hvd.elastic.replica_group().count
                time.sleep(args.step_time)
                sampler.record_step()
                state.step += 1
                state.stopping = bool(summed[1] > 0)
                record = dict(event="commit", step=state.step, epoch=state.epoch, size=hvd.size(), rank=hvd.rank(),
                              group=hvd.elastic.replica_group().index, loss=step_loss, micro=micro_batches,
                              params=torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
                # The step is committed once the commit's snapshot is taken, even where the commit
                # then raises: a host update (the ring changes before the next step), or a peer's
                # failure seen by its host-update check (the rollback comes back to this commit).
                before = state.commit_count
                try:
                    state.commit()
                finally:
                    if state.commit_count > before:
                        log(**record)
                if stop():
                    return
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    log(event="done", step=state.step, size=hvd.size(), rank=hvd.rank())


if __name__ == "__main__":
    main()
