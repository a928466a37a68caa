"""A new host's first step at the new size, Ringmaster beside torchft 0.2 in the same run, on a
quiet machine and with another process keeping a core busy, beside what the newcomer cannot
avoid: the cost of importing what a worker needs (torch, torch.distributed, torch._dynamo and
the training library), measured in the same conditions.

- Ringmaster: `ringmaster run` with a discovery script listing hostA:1 (an emulated host, one
  worker training tests/workloads/elastic_job.py, a commit every step); after 20 steps hostB:1 is
  written into the host file. Figure: seconds from that write to the first step committed at
  size 2 (the agent's launch, its template's imports, the fork, the worker's build, the ring switch).
- Ringmaster, a standing agent: `ringmaster serve` with the same discovery script, and each
  host's agent started ahead by the host itself (`ringmaster agent --rendezvous ...`, as a
  cluster's host service, Kubernetes or `srun` starts it; it warms its worker template before
  its hello). hostB's agent is connected but runs nothing until hostB is written into the host
  file; figure from that write, as above. What a cold host cannot avoid (the imports) is then
  paid before the host is needed.
- torchft: its lighthouse, and replica group 0 (one process: torchft's DDP and optimizer
  wrapper, a quorum every step, the same model and step time) training; after 20 steps group 1's
  process is started. Figure: seconds from that start to group 0's first committed step with 2
  participants (its interpreter and imports, the quorum, the heal from group 0).
- Imports: `python -c "import torch, torch.distributed, torch._dynamo, ringmaster.torch"`, wall seconds.

Run: python bench/newcomer.py --torchft-python /path/to/venv/bin/python [--rounds 2]
(torchft: `pip install torchft==0.2.0` with torch 2.13 in that venv.) Without
--torchft-python only Ringmaster's figures and the imports are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from torchft_hsdp import _free_port, available, lighthouse_main  # noqa: E402 (this folder's: the same lighthouse)

STEPS_BEFORE = 20
STEP_TIME_S = 0.02
#: What a worker imports before its script's first line can train (spare_process.PRELOADED).
WORKER_IMPORTS = "import torch, torch.distributed, torch._dynamo, ringmaster.torch"


# ----------------------------------------------------------------------------- Ringmaster
def ringmaster_newcomer_s(standing: bool = False) -> float:
    """Seconds from hostB written into the host file to the first step committed at size 2: with
    `standing`, under `serve` with both hosts' agents started ahead (hostB's connected, idle,
    until discovery lists it); else under `run`, whose launcher starts hostB's agent then."""
    from harness import WORKLOADS, Job, discovery_script, read_logs, wait_for, write_hosts

    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        script, hosts = discovery_script(d, {"hostA": 1})
        (d / "log").mkdir()
        job = Job(["--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.2",
                   *(["--api-port", "0"] if standing else []),
                   "python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(d / "log"), "--epochs", "1000",
                   "--samples", "256", "--step-time", str(STEP_TIME_S), "--timestamps"],
                  verb="serve" if standing else "run")
        agents: list = []
        try:
            if standing:
                address = str(job.wait_event("rendezvous.listening")["address"])
                agents = [Job(["--rendezvous", address, "--host", host, "--slots", "1"], verb="agent")
                          for host in ("hostA", "hostB")]
                job.wait_event("agent.connected", 180, host="hostB")
            job.wait_status(lambda s: s["world_size"] == 1 and s["steps"] >= STEPS_BEFORE, 180, "hostA training")

            def first_at_two() -> float | None:
                times = [r["time"] for records in read_logs(d / "log").values() for r in records
                         if r["event"] == "commit" and r["size"] == 2]
                return min(times) if times else None

            changed = time.time()
            write_hosts(hosts, {"hostA": 1, "hostB": 1})
            return wait_for(first_at_two, 300, "the first step at size 2", interval_s=0.05) - changed
        finally:
            for agent in agents:
                agent.kill()
            job.kill()


# ----------------------------------------------------------------------------- torchft
def torchft_worker(out: str) -> None:
    """One replica group of one process, as torchft's own DDP example trains (run under torchft's Python)."""
    import torch
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # the group's own world of one: its TCPStore (MASTER_PORT), which the manager uses
    group = int(os.environ["REPLICA_GROUP"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.01)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(loaded: dict) -> None:
        model.load_state_dict(loaded["model"])
        inner.load_state_dict(loaded["optim"])

    manager = Manager(pg=ProcessGroupGloo(), load_state_dict=load_state_dict, state_dict=state_dict,
                      min_replica_size=1, replica_id=f"group{group}", rank=0, world_size=1)
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    log = open(pathlib.Path(out) / f"{group}.jsonl", "a", buffering=1)
    generator = torch.Generator().manual_seed(group)
    while True:
        optimizer.zero_grad()  # (starts the quorum)
        x = torch.randn(16, 4, generator=generator)
        ddp(x).square().mean().backward()
        time.sleep(STEP_TIME_S)  # (the step's compute, as elastic_job.py's --step-time)
        optimizer.step()  # (commits where the quorum agreed)
        log.write(json.dumps({"group": group, "participants": manager.num_participants(), "time": time.time()}) + "\n")


def torchft_newcomer_s(python: str) -> float:
    from harness import wait_for

    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        procs: list[subprocess.Popen] = []
        output = open(d / "torchft.log", "w")

        def spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
            proc = subprocess.Popen([python, __file__, *argv], env={**os.environ, **env}, start_new_session=True,
                                    stdout=output, stderr=subprocess.STDOUT)
            procs.append(proc)
            return proc

        def records(group: int) -> list[dict]:
            path = d / f"{group}.jsonl"
            return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")] \
                if path.exists() else []

        def alive(check):
            def look():
                for proc in procs:
                    if proc.poll() is not None:
                        raise SystemExit(f"a torchft process exited ({proc.returncode}):\n"
                                         f"{(d / 'torchft.log').read_text()[-4000:]}")
                return check()
            return look

        def group(number: int) -> subprocess.Popen:
            return spawn(["--torchft-worker", str(d)], {"REPLICA_GROUP": str(number), "TORCHFT_LIGHTHOUSE": address,
                                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                                                       "RANK": "0", "WORLD_SIZE": "1", "PYTHONPATH": ""})

        try:
            spawn(["--lighthouse", str(d / "lighthouse")], {"PYTHONPATH": ""})
            address = wait_for(alive(lambda: (d / "lighthouse").exists() and (d / "lighthouse").read_text()), 120,
                               "torchft's lighthouse")
            group(0)
            wait_for(alive(lambda: len(records(0)) >= STEPS_BEFORE), 300, "torchft's group 0 training")
            started = time.time()
            group(1)
            joined = wait_for(alive(lambda: [r["time"] for r in records(0) if r["participants"] == 2
                                             and r["time"] > started]), 300, "torchft's group 0 stepping with 2")
            return joined[0] - started
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            output.close()


# ----------------------------------------------------------------------------- the driver
def import_s() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", WORKER_IMPORTS], check=True, timeout=600)
    return time.perf_counter() - started


class Busy:
    """Another process keeping one core busy while the figures are measured (a real cluster's neighbour)."""

    def __init__(self, on: bool) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None

    def __enter__(self) -> "Busy":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--torchft-python", default=None, help="a Python with torchft 0.2.0 (and torch 2.13)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--torchft-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torchft_worker:
        torchft_worker(args.torchft_worker)
        return 0
    if args.lighthouse:
        lighthouse_main(args.lighthouse)  # (bench/sharded.py's: TorchTitan's documented lighthouse)
        return 0
    if args.torchft_python:
        unusable = available(args.torchft_python)
        if unusable is not None:
            sys.exit(f"--torchft-python {args.torchft_python}: {unusable}")
    print(f"{os.cpu_count()} cores; {args.rounds} round(s) each; a new host (one worker) joins one training")
    for busy in (False, True):
        with Busy(busy):
            rows = {"imports": [import_s() for _ in range(args.rounds)],
                    "ringmaster": [ringmaster_newcomer_s() for _ in range(args.rounds)],
                    "ringmaster, standing agent": [ringmaster_newcomer_s(standing=True) for _ in range(args.rounds)]}
            if args.torchft_python:
                rows["torchft"] = [torchft_newcomer_s(args.torchft_python) for _ in range(args.rounds)]
        print(f"\n{'a core kept busy' if busy else 'quiet'}:")
        for name, values in rows.items():
            what = "a worker's imports" if name == "imports" else f"{name}: new host -> first step at size 2"
            print(f"  {what:62s} {statistics.median(values):6.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
        ours, imports = statistics.median(rows["ringmaster"]), statistics.median(rows["imports"])
        line = f"  Ringmaster past the imports: {ours - imports:+.2f} s (goal: at most 1 s)"
        if "torchft" in rows:
            theirs = statistics.median(rows["torchft"])
            line += (f"; Ringmaster / torchft: {ours / theirs:.2f}, with a standing agent "
                     f"{statistics.median(rows['ringmaster, standing agent']) / theirs:.2f} (goal: at most 0.5)")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
