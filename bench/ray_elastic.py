"""Ringmaster's `ElasticRayExecutor` against Ray Train's elastic training, on one real Ray cluster.

A Ray cluster on this machine (`ray.cluster_utils.Cluster`, loopback only: a head with no CPU
for workers and `--nodes` worker nodes of one CPU each) runs the same training (a small MLP,
`--step-time` of sleep standing for a step's compute, the same steps) twice: once under
`ElasticRayExecutor` (commits in memory every step) and once under Ray Train's `TorchTrainer` with
`ScalingConfig(num_workers=(min, max))` (elastic: Ray Train restarts its whole worker group on a
change and the training function resumes from its last reported checkpoint, here every
`--checkpoint-every` steps, in a folder on local disk). In each, mid-training:

1. a node is added: seconds from `add_node` returning until the first step at the larger size;
2. that node is removed (`remove_node`: its raylet and every process on it die): seconds until the
   first step at the smaller size, and the steps redone (trained before the removal and again
   after it: the rollback).

Ray Train polls for new resources every `elastic_resize_monitor_interval_s` (60 s by default): set
to 1 s here, as Ringmaster's discovery interval, so neither waits on a timer the other lacks.

Run: python bench/ray_elastic.py [--nodes 2] [--steps 400] [--step-time 0.03] [--repeats 1]
"""

from __future__ import annotations

import os

# Ray on loopback only (read when Ray is first imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import argparse  # noqa: E402
import logging  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from harness import wait_for  # noqa: E402

#: Seconds one change may take before the benchmark gives up on it.
CHANGE_TIMEOUT_S = 180.0


def _model_and_data(seed: int):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    generator = torch.Generator().manual_seed(seed)
    return model, generator


def _step(model, optimizer, generator) -> None:
    import torch

    inputs = torch.randn(32, 64, generator=generator)
    optimizer.zero_grad()
    loss = (model(inputs) - inputs.mean(dim=1, keepdim=True)).pow(2).mean()
    loss.backward()
    optimizer.step()


def ringmaster_training(log_path: str, steps: int, step_time: float) -> int:
    """Runs on every Ringmaster worker: commits every step; rank 0 logs `time step size`."""
    import torch

    import ringmaster.torch as hvd

    hvd.init()
    model, generator = _model_and_data(hvd.rank())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    @hvd.elastic.run
    def loop(state) -> None:
        while state.step < steps:
            _step(model, optimizer, generator)
            time.sleep(step_time)
            state.step += 1
            if hvd.rank() == 0:
                with open(log_path, "a") as file:
                    file.write(f"{time.time()} {state.step} {hvd.size()}\n")
            state.commit()

    loop(state)
    return state.step


def ray_train_training(config: dict) -> None:
    """Runs on every Ray Train worker: DDP, a checkpoint every `checkpoint_every` steps; rank 0
    logs `time step size`."""
    import ray.train
    import ray.train.torch
    import torch

    context = ray.train.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    plain, generator = _model_and_data(rank)
    model: Any = ray.train.torch.prepare_model(plain)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            saved = torch.load(os.path.join(folder, "state.pt"), weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = int(saved["step"])
    while step < config["steps"]:
        _step(model, optimizer, generator)
        time.sleep(config["step_time"])
        step += 1
        if rank == 0:
            with open(config["log_path"], "a") as file:
                file.write(f"{time.time()} {step} {size}\n")
        if step % config["checkpoint_every"] == 0 or step == config["steps"]:
            with tempfile.TemporaryDirectory() as folder:
                if rank == 0:
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                               os.path.join(folder, "state.pt"))
                ray.train.report({"step": step},
                                 checkpoint=ray.train.Checkpoint.from_directory(folder) if rank == 0 else None)


def _read(log: pathlib.Path) -> list[tuple[float, int, int]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), int(parts[1]), int(parts[2])))
    return out


def _first_at(log: pathlib.Path, size: int, after: float) -> tuple[float, int] | None:
    """(time, step) of the first step at `size` logged after `after`."""
    return next(((t, step) for t, step, s in _read(log) if s == size and t > after), None)


def _steps_at(log: pathlib.Path, size: int) -> int:
    return sum(1 for _t, _step, s in _read(log) if s == size)


def exercise(cluster, log: pathlib.Path, start: Callable[[], Any], nodes: int) -> dict[str, float]:
    """Start the job, add a node, remove it; the seconds each change took and the steps redone."""
    job = threading.Thread(target=start, daemon=True)
    job.start()
    wait_for(lambda: _steps_at(log, nodes) >= 30, CHANGE_TIMEOUT_S, f"30 steps at {nodes} workers")
    added = cluster.add_node(num_cpus=1)
    at = time.time()
    grown = wait_for(lambda: _first_at(log, nodes + 1, at), CHANGE_TIMEOUT_S, f"a step at {nodes + 1} workers")
    wait_for(lambda: _steps_at(log, nodes + 1) >= 30, CHANGE_TIMEOUT_S, f"30 steps at {nodes + 1} workers")
    before = max(step for _t, step, _s in _read(log))
    cluster.remove_node(added)
    removed_at = time.time()
    shrunk = wait_for(lambda: _first_at(log, nodes, removed_at), CHANGE_TIMEOUT_S, f"a step at {nodes} workers again")
    job.join(CHANGE_TIMEOUT_S * 2)
    return {"added": grown[0] - at, "removed": shrunk[0] - removed_at, "redone": max(0, before - shrunk[1] + 1)}


def run_ringmaster(cluster, folder: pathlib.Path, args: argparse.Namespace) -> dict[str, float]:
    from ringmaster.ray import ElasticRayExecutor

    log = folder / "ringmaster.log"
    executor = ElasticRayExecutor(min_workers=args.nodes, max_workers=args.nodes + 1, dashboard=False)
    executor.start()
    try:
        return exercise(cluster, log, lambda: executor.run(
            ringmaster_training, kwargs={"log_path": str(log), "steps": args.steps, "step_time": args.step_time}),
            args.nodes)
    finally:
        executor.shutdown()


def run_ray_train(cluster, folder: pathlib.Path, args: argparse.Namespace) -> dict[str, float]:
    from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.torch.torch_trainer import TorchTrainer

    log = folder / "ray_train.log"
    trainer = TorchTrainer(
        ray_train_training,
        train_loop_config={"log_path": str(log), "steps": args.steps, "step_time": args.step_time,
                           "checkpoint_every": args.checkpoint_every},
        scaling_config=ScalingConfig(num_workers=(args.nodes, args.nodes + 1), use_gpu=False,
                                               elastic_resize_monitor_interval_s=1.0),
        run_config=RunConfig(storage_path=str(folder / "ray_train_storage"), name="bench",
                                       failure_config=FailureConfig(max_failures=10)),
    )
    return exercise(cluster, log, trainer.fit, args.nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2, help="worker nodes (one CPU each) before a node is added")
    parser.add_argument("--steps", type=int, default=400, help="training steps of each job")
    parser.add_argument("--step-time", type=float, default=0.03, help="seconds of compute each step stands for")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="Ray Train's checkpoint interval, in steps")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        cluster.wait_for_nodes()
        figures: dict[str, list[dict[str, float]]] = {"ringmaster": [], "ray_train": []}
        for repeat in range(args.repeats):
            for name, run in (("ringmaster", run_ringmaster), ("ray_train", run_ray_train)):
                with tempfile.TemporaryDirectory() as folder:
                    figures[name].append(run(cluster, pathlib.Path(folder), args))
                print(f"repeat {repeat + 1} {name}: {figures[name][-1]}", flush=True)
        print(f"\n{args.nodes} -> {args.nodes + 1} -> {args.nodes} workers (1 CPU node each), step {args.step_time} s, "
              f"Ray Train checkpoints every {args.checkpoint_every} steps; medians of {args.repeats}:")
        print(f"{'':22}{'node added -> step':>20}{'node removed -> step':>22}{'steps redone':>14}")
        for name, label in (("ringmaster", "Ringmaster on Ray"), ("ray_train", "Ray Train (elastic)")):
            rows = figures[name]
            print(f"{label:22}{statistics.median(r['added'] for r in rows):>18.2f} s"
                  f"{statistics.median(r['removed'] for r in rows):>20.2f} s"
                  f"{statistics.median(r['redone'] for r in rows):>14.0f}")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
