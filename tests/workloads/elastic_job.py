"""Training workload for the end-to-end tests: a Horovod elastic script with a log.

Every worker appends JSON lines to `<log-dir>/<worker id>.jsonl`:
  {"event": "synced", "generation", "rank", "size", "step", "checksum"}  after each (re)sync
  {"event": "commit", "generation", "rank", "size", "step"}              after each commit
  {"event": "epoch", "epoch", "min", "max"}  rank 0, at the end of each epoch: how often each
      sample of the epoch reached the committed model (exactly once means min == max == 1)
  {"event": "done", "step", "checksum", "size"}  when the training function returned
`seen` counts samples through an allreduce into the state, so it records exactly what the
committed model has seen, across rollbacks and resizes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch

import worker.torch as hvd


def checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.state_dict().values()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--step-time", type=float, default=0.05, help="simulated compute per step")
    parser.add_argument("--timestamps", action="store_true", help="add wall-clock times (for benchmarks)")
    parser.add_argument("--file-size-limit-at-step", type=int, default=None, metavar="N",
                        help="fault injection: from step N on, rank 0 may not write files over 256 KiB (RLIMIT_FSIZE: "
                             "the kernel fails larger writes with EFBIG, as a full disk fails them with ENOSPC)")
    parser.add_argument("--ballast-mb", type=float, default=0.0, help="extra tensor state (makes checkpoints this large)")
    args = parser.parse_args()

    hvd.init()
    worker_id = os.environ.get("RINGMASTER_WORKER_ID", "local").replace("/", "_")
    log_path = os.path.join(args.log_dir, f"{worker_id}.jsonl")

    def log(**record) -> None:
        if args.timestamps:
            record["time"] = time.time()
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    torch.manual_seed(1234)
    dataset = torch.utils.data.TensorDataset(torch.arange(args.samples, dtype=torch.float32).unsqueeze(1))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = torch.nn.Linear(1, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0, seen=torch.zeros(args.samples),
        ballast=torch.zeros(int(args.ballast_mb * (1 << 18))),
    )

    def on_reset() -> None:
        log(event="reset", size=hvd.size(), rank=hvd.rank())

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state) -> None:
        generation = hvd.context().assignment.generation
        log(event="synced", generation=generation, rank=hvd.rank(), size=hvd.size(), step=state.step, checksum=checksum(model))
        while state.epoch < args.epochs:
            for batch_idx, (data,) in enumerate(loader):
                if args.timestamps:
                    log(event="begin", step=state.step + 1)
                optimizer.zero_grad()
                loss = (model(data) ** 2).mean()
                loss.backward()
                optimizer.step()
                counts = torch.zeros(args.samples)
                counts[data.squeeze(1).long()] += 1
                state.seen += hvd.allreduce(counts, op=hvd.Sum)
                time.sleep(args.step_time)
                state.step += 1
                state.sampler.record_batch(batch_idx, args.batch_size)
                if args.file_size_limit_at_step is not None and state.step == args.file_size_limit_at_step and hvd.rank() == 0:
                    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
                    log(event="fault", step=state.step)
                state.commit()
                log(event="commit", generation=generation, rank=hvd.rank(), size=hvd.size(), step=state.step)
            if hvd.rank() == 0:
                log(event="epoch", epoch=state.epoch, min=float(state.seen.min()), max=float(state.seen.max()))
            state.epoch += 1
            state.seen = torch.zeros(args.samples)
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    log(event="done", step=state.step, checksum=checksum(model), size=hvd.size(), rank=hvd.rank())


if __name__ == "__main__":
    main()
