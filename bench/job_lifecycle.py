"""What a job costs around its training: from the command's start to the first step, and from the
last step to the command's exit, for the same small job under `ringmaster run` and `torchrun`.

The job: `--np` workers (default 2) on this machine, a 1 M-parameter linear layer, 20 steps of an allreduce of its
gradient (Horovod's API and a commit each step under Ringmaster; `torch.distributed` on Gloo under
torchrun). Each worker prints when its first step ended and when its last did; the bench times
the command from outside. What it prints, medians over `--rounds`:
  - start: the command launched -> every worker's first step done;
  - end: the last worker's last step -> the command exited (its workers' and its own exit);
  - whole: the command launched -> exited;
  - cpu: the CPU time the command and every process under it used (the machine's real cost).
Neither has warm spares (a fresh machine's first job); torchrun's store is `--standalone`.
Ringmaster runs twice: with its agent's worker template (the default: the workers are forked
from one process that imported torch once) and with `RINGMASTER_FORK_WORKERS=0` (each fresh).

Run: python bench/job_lifecycle.py [--rounds 3] [--np 2]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from ringmaster.settings import FORK_WORKERS_ENV

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEPS = 20

WORKER = """
import os, sys, time
import torch

def say(what):  # (one write: two workers' lines never interleave)
    os.write(1, f"{what} {time.time()}\\n".encode())
mode = sys.argv[1]
model = torch.nn.Linear(1000, 1000)
if mode == "ringmaster":
    import ringmaster.torch as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < {steps}:
            opt.zero_grad()
            model(torch.ones(8, 1000)).sum().backward()
            opt.step()
            state.step += 1
            state.commit()
            if state.step == 1:
                say("FIRST")
    train(state)
else:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range({steps}):
        opt.zero_grad()
        model(torch.ones(8, 1000)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        if step == 0:
            say("FIRST")
    dist.destroy_process_group()
say("LAST")
""".replace("{steps}", str(STEPS))


def one_run(command: list[str], env: dict[str, str], workers: int) -> tuple[float, float, float, float]:
    """(start, end, whole, cpu) seconds of one run of `command`."""
    cpu_before = _children_cpu()
    began = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    ended = time.time()
    cpu = _children_cpu() - cpu_before
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    said = done.stdout + done.stderr
    firsts, lasts = (re.findall(rf"{what} (\d+\.\d+)", said) for what in ("FIRST", "LAST"))
    if len(firsts) != workers or len(lasts) != workers:
        raise SystemExit(f"expected {workers} workers' FIRST and LAST lines, got:\n{said[-3000:]}")
    return max(map(float, firsts)) - began, ended - max(map(float, lasts)), ended - began, cpu


def _children_cpu() -> float:
    """CPU seconds of every process this one waited for (a process' own children counted in it
    when it waited for them: the agents' workers, the template's forks)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--np", type=int, default=2, help="workers (default: %(default)s)")
    args = parser.parse_args()
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        raise SystemExit("torchrun is missing: install torch in this interpreter's environment")
    with tempfile.TemporaryDirectory() as tmp:
        script = pathlib.Path(tmp) / "worker.py"
        script.write_text(WORKER)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "RINGMASTER_SPARES": "0", "OMP_NUM_THREADS": "1"}
        ringmaster = [sys.executable, "-m", "ringmaster.cli", "run", "-np", str(args.np),
                      "python", str(script), "ringmaster"]
        commands = {
            "ringmaster run": (ringmaster, env),
            "ringmaster fresh": (ringmaster, {**env, FORK_WORKERS_ENV: "0"}),
            "torchrun": ([torchrun, "--standalone", "--nproc-per-node", str(args.np), str(script), "torchrun"], env),
        }
        figures: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in commands}
        for _ in range(args.rounds):  # (alternated, so that the machine's drift falls on each)
            for name, (command, environment) in commands.items():
                figures[name].append(one_run(command, environment, args.np))
    print(f"a job of {args.np} workers, {STEPS} steps; medians of {args.rounds} alternated runs (seconds)")
    print(f"{'':16s} {'start->1st step':>16s} {'last step->exit':>16s} {'whole':>8s} {'cpu':>8s}")
    for name, runs in figures.items():
        start, end, whole, cpu = (statistics.median(r[i] for r in runs) for i in range(4))
        print(f"{name:16s} {start:16.2f} {end:16.2f} {whole:8.2f} {cpu:8.2f}")


if __name__ == "__main__":
    main()
