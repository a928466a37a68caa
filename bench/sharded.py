"""FSDP2 inside replica groups, side by side in one run: plain FSDP2 under torchrun against a
Ringmaster job of the same groups (`--group-size 2`, `hvd.elastic.ShardedState`).

The same model in both: a small transformer language model (`--dim`, `--layers`, `--vocab`;
the default has 17.6 M parameters, 282 MB of training state with Adam, so each worker of a
group of 2 holds half), every layer and the root sharded with `fully_shard` on a ("replicate",
"shard") mesh of 2 groups of 2 (HSDP), Adam, random tokens drawn per step and rank, one
thread per worker. First plain FSDP2: `torchrun --standalone --nproc-per-node 4`, the mesh from
`init_device_mesh`, no commits. Then `ringmaster run -np 4 --group-size 2` with a commit every
step (each worker's shards into host memory, two kept), measured:
  - the median step time over the same steps (rank 0, steps after the warm-up), against plain FSDP2's;
  - peak memory per worker (the largest resident set of the four), against plain FSDP2's: on a
    CPU the commits' host buffers are the same memory as the training state; on a GPU they are
    host memory beside it (the figure to compare there is the device's);
  - a group lost: SIGKILL of rank 3, to the surviving group back in training (rank 0 entering
    the training function again, synced, on its new mesh) and to its first step committed;
  - a group added: the freed slot refilled, the job grown back to two groups: the survivors'
    pause (their last step before the new ring to training again, and to their first step in
    it, with how long that step took against a step), the bytes moved to heal the new group (what
    its members received, peer to peer) and how long after its processes started it stepped
    with the others (from the top of its workers' script: forked from their agent's warm
    template, as a Ringmaster host's workers are, they have torch imported already; torchft's
    figure counts from starting its processes, imports included).
Then torchft 0.2.0's HSDP on the same model and steps, where torchft is installed (`bench/torchft_hsdp.py`:
a world per replica group, torchft's Manager across groups in FSDP2's all-reduce hook, its
lighthouse): its step time, peak memory, a group lost and a group added, measured the same way.

A group lost and added is measured `--rounds` times for each system (default 4), and each of
those figures printed as the median of the rounds with every round's value: a step on these 2
cores spreads by 0.2 s and more from one to the next, which one round mistakes for a difference.
The rounds are split over `--jobs` jobs of each system (default 2), run alternately (Ringmaster,
torchft, Ringmaster, torchft): this machine's speed drifts over minutes (the same job's steady
step measured 1.44 s and 1.66 s in two runs ten minutes apart, torchft's 1.53 s and 1.51 s
between them), and one job of each, one after the other, put that drift between the systems;
the steady step is the median over every job's timed steps.

Run: python bench/sharded.py [--steps 20] [--rounds 4] [--jobs 2] [--dim 512] [--layers 4] [--torchft-python PYTHON]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))  # (its sibling, run as a script or imported)
import torchft_hsdp  # noqa: E402

WARMUP = 3


def model_and_optimizer(args: argparse.Namespace, mesh: Any) -> dict:
    """The transformer, sharded on `mesh`, and its Adam optimizer (the same in both runs)."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.dim)
            self.layers = nn.ModuleList(nn.TransformerEncoderLayer(args.dim, 8, 4 * args.dim, dropout=0.0,
                                                                   batch_first=True) for _ in range(args.layers))
            self.head = nn.Linear(args.dim, args.vocab)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    torch.manual_seed(0)
    model = LM()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-4)}


def loss_of(objects: dict, args: argparse.Namespace, step: int, data_rank: int) -> Any:
    """The loss of the step's batch (random tokens drawn per step and rank), before its backward."""
    import torch

    generator = torch.Generator().manual_seed(1_000_003 * step + data_rank)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator)
    logits = objects["model"](tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))


def train_step(objects: dict, args: argparse.Namespace, step: int, data_rank: int) -> float:
    loss = loss_of(objects, args, step, data_rank)
    loss.backward()
    objects["optimizer"].step()
    objects["optimizer"].zero_grad()
    return float(loss.detach())


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plain_worker(args: argparse.Namespace) -> None:
    """A torchrun worker: plain FSDP2 on a (2, 2) mesh, `args.steps` timed steps after the warm-up."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    objects = model_and_optimizer(args, mesh)
    times = []
    for step in range(WARMUP + args.steps):
        started = time.perf_counter()
        train_step(objects, args, step, dist.get_rank())
        times.append(time.perf_counter() - started)
    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak_rss_mb())
    if dist.get_rank() == 0:
        params = sum(p.numel() for p in objects["model"].parameters())
        pathlib.Path(args.out).write_text(json.dumps({"times": times[WARMUP:], "peaks": peaks, "params": params}))
    dist.barrier()  # (no rank tears Gloo down while a peer is still in the last collective)
    dist.destroy_process_group()


def ringmaster_worker(args: argparse.Namespace) -> None:
    """A worker of `ringmaster run --group-size 2`: the same steps, a commit each, until the stop file."""
    began = time.time()  # (as near its process' start as the script gets: a fork of the agent's warm template)
    import torch

    import ringmaster.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    log = open(pathlib.Path(args.out) / f"{os.environ['RINGMASTER_WORKER_ID'].replace('/', '_')}.jsonl", "a",
               buffering=1)
    log.write(json.dumps({"event": "started", "pid": os.getpid(), "time": began}) + "\n")
    state = hvd.elastic.ShardedState(lambda mesh: model_and_optimizer(args, mesh), step=0)

    @hvd.elastic.run
    def train(state) -> None:
        generation = hvd.context().assignment.generation
        log.write(json.dumps({"event": "entered", "generation": generation, "rank": hvd.rank(), "size": hvd.size(),
                              "pid": os.getpid(), "step": state.step, "healed_bytes": state.healed_bytes,
                              "time": time.time()}) + "\n")
        while True:
            stop = torch.tensor([float(hvd.rank() == 0 and os.path.exists(args.stop))])
            if hvd.allreduce(stop, op=hvd.Max).item():
                return
            started = time.perf_counter()
            train_step({"model": state.model, "optimizer": state.optimizer}, args, state.step, hvd.rank())
            trained = time.perf_counter()
            state.step += 1

            def logged() -> None:
                log.write(json.dumps({"event": "step", "generation": generation, "rank": hvd.rank(), "size": hvd.size(),
                                      "step": state.step, "time": time.time(), "train_s": trained - started,
                                      "step_s": time.perf_counter() - started, "rss_mb": peak_rss_mb()}) + "\n")

            try:
                state.commit()
            except hvd.elastic.HostsUpdatedInterrupt:
                logged()  # (committed, then told of the new ring: the pause starts here, not a step earlier)
                raise
            logged()

    train(state)


# ------------------------------------------------------------------ the driver
def records(folder: pathlib.Path) -> list[dict]:
    found = []
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                found.append(dict(json.loads(line), worker=path.stem))
    return sorted(found, key=lambda r: r["time"])


def wait_for(check, timeout_s: float, what: str, job: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job is not None and job.poll() is not None:
            raise SystemExit(f"the job exited ({job.returncode}) while waiting for {what}")
        found = check()
        if found:
            return found
        time.sleep(0.05)  # (polling the workers' logs, with a deadline)
    raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


def run_plain(args: argparse.Namespace, scratch: pathlib.Path) -> dict:
    out = scratch / "plain.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", __file__,
               "--worker", "plain", "--out", str(out), *model_flags(args)]
    done = subprocess.run(command, timeout=1200, start_new_session=True, stdout=subprocess.DEVNULL)
    if not out.exists():
        raise SystemExit(f"plain FSDP2 under torchrun failed (exit code {done.returncode}) before its figures")
    if done.returncode != 0:  # (seen: "terminate called without an active exception" in a worker's teardown)
        print(f"note: plain FSDP2 under torchrun exited with {done.returncode} after writing its figures", flush=True)
    return json.loads(out.read_text())


def run_ringmaster(args: argparse.Namespace, scratch: pathlib.Path) -> dict:
    logs, stop = scratch / "ringmaster", scratch / "stop"
    logs.mkdir()
    command = [sys.executable, "-m", "ringmaster.cli", "run", "--min-np", "2", "--max-np", "4", "-H", "localhost:4",
               "--group-size", "2", "--spares", "0", "--collective-timeout", "60", "python", __file__,
               "--worker", "ringmaster", "--out", str(logs), "--stop", str(stop), *model_flags(args)]
    output = open(scratch / "job.log", "w")
    job = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdout=output, stderr=subprocess.STDOUT)
    try:
        def steps_at(size: int) -> list[dict]:
            return [r for r in records(logs) if r["event"] == "step" and r["size"] == size and r["rank"] == 0]

        wait_for(lambda: len(steps_at(4)) >= WARMUP + args.steps, 1200, "the timed steps of two groups", job)
        timed = steps_at(4)[WARMUP:WARMUP + args.steps]
        rss = max(r["rss_mb"] for r in records(logs) if r["event"] == "step")
        rounds = []
        for _ in range(args.rounds):  # (a group lost, then added back: each round the same)
            victim = next(r for r in reversed(records(logs)) if r["event"] == "entered" and r["rank"] == 3)
            killed = time.time()
            os.kill(victim["pid"], signal.SIGKILL)
            first = wait_for(lambda: [r for r in steps_at(2) if r["time"] > killed], 300,
                             "the surviving group's step", job)[0]
            resumed = next(r for r in records(logs) if r["event"] == "entered" and r["size"] == 2 and r["rank"] == 0
                           and r["time"] > killed)
            regrown = wait_for(lambda: [r for r in records(logs) if r["event"] == "entered" and r["size"] == 4
                                        and r["time"] > killed and r["rank"] == 0], 600, "the job grown back", job)[0]
            after = wait_for(lambda: [r for r in steps_at(4) if r["time"] > regrown["time"]], 600,
                             "a step of two groups again", job)[0]
            before = max((r for r in steps_at(2) if r["time"] < regrown["time"]), key=lambda r: r["time"])
            healed = sum(r["healed_bytes"] for r in records(logs) if r["event"] == "entered"
                         and r["generation"] == regrown["generation"])
            # (the refilled group's processes: started after the kill)
            newcomers_began = min(r["time"] for r in records(logs) if r["event"] == "started" and r["time"] > killed)
            wait_for(lambda: len([r for r in steps_at(4) if r["time"] > after["time"]]) >= 2, 600,
                     "two more steps of two groups", job)  # (the next round starts from a job in step)
            rounds.append({"lost_to_first_step_s": first["time"] - killed,
                           "lost_to_training_s": resumed["time"] - killed,
                           "pause_s": after["time"] - before["time"],
                           "pause_to_training_s": regrown["time"] - before["time"],
                           "healed_mb": healed / 2**20, "step_at_join_s": after["step_s"],
                           "started_to_joined_s": after["time"] - newcomers_began})
        stop.touch()
        job.wait(300)
    except SystemExit as exc:
        raise SystemExit(f"{exc}; the job said:\n{(scratch / 'job.log').read_text()[-6000:]}") from None
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        output.close()
    return {"times": [r["step_s"] for r in timed], "train_times": [r["train_s"] for r in timed], "peak_mb": rss,
            **medians(rounds)}


def rounds_of(job: int, rounds: int, jobs: int) -> int:
    """How many of the `rounds` the `job`-th of `jobs` jobs measures (the first ones take the rest)."""
    return rounds // jobs + (job < rounds % jobs)


def pooled(jobs: list[dict]) -> dict:
    """One system's figures over its jobs: every job's timed steps and rounds together, each
    round's figure the median over all of them, the peak memory the largest."""
    rounds: list[dict] = []
    for job in jobs:
        keys = [key.removesuffix("_all") for key in job if key.endswith("_all")]
        rounds += [dict(zip(keys, values)) for values in zip(*(job[f"{key}_all"] for key in keys))]
    steps = {key: [value for job in jobs for value in job[key]] for key in ("times", "train_times") if key in jobs[0]}
    return {**steps, "peak_mb": max(job["peak_mb"] for job in jobs), **medians(rounds)}


def medians(rounds: list[dict]) -> dict:
    """Each figure of the rounds: its median, and all of them under the name + "_all"."""
    return {**{key: statistics.median(r[key] for r in rounds) for key in rounds[0]},
            **{f"{key}_all": [r[key] for r in rounds] for key in rounds[0]}}


def spread(figures: dict, key: str) -> str:
    """A figure's median over the rounds, with every round's value when there were several."""
    values = figures[f"{key}_all"]
    each = f" (median of {', '.join(f'{v:.2f}' for v in values)})" if len(values) > 1 else ""
    return f"{figures[key]:.2f} s{each}"


def model_flags(args: argparse.Namespace) -> list[str]:
    return ["--dim", str(args.dim), "--layers", str(args.layers), "--vocab", str(args.vocab), "--batch",
            str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("plain", "ringmaster", "torchft", "lighthouse"))
    parser.add_argument("--torchft-python", default=sys.executable, metavar="PYTHON",
                        help="a Python with torchft 0.2.0 and this torch (default: this one); torchft is skipped, "
                             "saying why, where it cannot be imported")
    parser.add_argument("--out")
    parser.add_argument("--stop")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4,
                        help="how often a group is lost and added back for each system, over its jobs (the figures "
                             "are the medians)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="how many jobs of each system share the rounds, run alternately with the other's")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--keep", metavar="DIR", help="keep the workers' logs and the job's output in DIR")
    args = parser.parse_args()
    if args.worker == "plain":
        return plain_worker(args)
    if args.worker == "ringmaster":
        return ringmaster_worker(args)
    if args.worker == "torchft":
        return torchft_hsdp.worker_main(args, model_and_optimizer, loss_of, peak_rss_mb)
    if args.worker == "lighthouse":
        return torchft_hsdp.lighthouse_main(args.out)
    if args.jobs < 1 or args.rounds < args.jobs:
        parser.error(f"--rounds ({args.rounds}) must be at least --jobs ({args.jobs}), which must be 1 or more")
    missing = torchft_hsdp.available(args.torchft_python)
    with tempfile.TemporaryDirectory(prefix="ringmaster-sharded-") as tmp:
        scratch = pathlib.Path(args.keep or tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        plain = run_plain(args, scratch)
        our_jobs, their_jobs = [], []
        for job in range(args.jobs):  # (alternately, so that the machine's drift falls on both)
            folder = scratch / f"job{job + 1}"
            folder.mkdir(exist_ok=True)
            share = argparse.Namespace(**{**vars(args), "rounds": rounds_of(job, args.rounds, args.jobs)})
            our_jobs.append(run_ringmaster(share, folder))
            if not missing:
                their_jobs.append(torchft_hsdp.run(share, folder, __file__, model_flags(args), WARMUP, records,
                                                   wait_for))
        ours = pooled(our_jobs)
        theirs = pooled(their_jobs) if their_jobs else None
    base, step, train = (statistics.median(x) for x in (plain["times"], ours["times"], ours["train_times"]))
    peak = max(plain["peaks"])
    print(f"model: {plain['params'] / 1e6:.1f} M parameters, 2 groups of 2 (HSDP), Gloo, 1 thread per worker")
    print(f"step time, median of {args.steps}: plain FSDP2 (torchrun) {base * 1e3:.0f} ms; Ringmaster {step * 1e3:.0f} "
          f"ms with a commit each step ({step / base:.2f}x), {train * 1e3:.0f} ms of it training ({train / base:.2f}x)")
    print(f"peak memory per worker: plain FSDP2 {peak:.0f} MB; Ringmaster {ours['peak_mb']:.0f} MB "
          f"({ours['peak_mb'] / peak:.2f}x; on CPU the two commits' host buffers count here)")
    print(f"a group lost (SIGKILL of rank 3; medians of {args.rounds} rounds): the surviving group back in training "
          f"{spread(ours, 'lost_to_training_s')} later (synced, on its new mesh), its first step committed "
          f"{spread(ours, 'lost_to_first_step_s')} later")
    print(f"a group added: the survivors' last step to training again {spread(ours, 'pause_to_training_s')} (the new "
          f"group healed with {ours['healed_mb']:.1f} MB peer to peer), to their first step in it "
          f"{spread(ours, 'pause_s')} (that step {spread(ours, 'step_at_join_s')}, a step {step:.2f} s); the new group "
          f"stepping with the others {spread(ours, 'started_to_joined_s')} after its processes started")
    if theirs is None:
        print(f"torchft: not run ({missing}; give --torchft-python a Python with torchft 0.2.0)")
    else:
        print("\n".join(torchft_hsdp.summary(ours, theirs, base, spread)))


if __name__ == "__main__":
    main()
