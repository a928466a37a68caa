"""torchft's fault-tolerant HSDP, run the way torchft 0.2.0 and TorchTitan run it, for
`bench/sharded.py`'s side-by-side figures: each replica group of 2 is its own torch world (its own
TCPStore and Gloo group, FSDP2 on a one-dimensional mesh of the group), and the gradient shards
FSDP2 reduce-scatters are averaged across groups by torchft's `Manager.allreduce` in FSDP2's
all-reduce hook, on torchft's reconfigurable Gloo group; a quorum is asked at every step (from
torchft's Rust lighthouse, run with TorchTitan's documented flags) and a group that joins heals
from the group at the same rank, peer to peer (`PGTransport`). A group's worker lost takes that
group down (torchft restarts a replica group whole, as torchelastic does under TorchTitan).

Needs torchft (`pip install torchft==0.2.0`, with torch 2.13) in the Python given to
`bench/sharded.py --torchft-python`; runs nothing of Ringmaster's.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any, Callable

#: TorchTitan's documented lighthouse: `torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100
#: --join_timeout_ms 10000` (its heartbeat timeout left at the lighthouse's default).
LIGHTHOUSE = {"min_replicas": 1, "quorum_tick_ms": 100, "join_timeout_ms": 10_000}


def lighthouse_main(out: str) -> None:
    """Serve torchft's lighthouse until killed; its address goes to `out`."""
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind="[::]:0", **LIGHTHOUSE)
    pathlib.Path(out + ".tmp").write_text(server.address())
    os.replace(out + ".tmp", out)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.shutdown()


def worker_main(args: argparse.Namespace, build: Callable[[argparse.Namespace, Any], dict],
                loss_of: Callable[[dict, argparse.Namespace, int, int], Any], peak_rss_mb: Callable[[], float]) -> None:
    """One worker of replica group $REPLICA_GROUP: FSDP2 on its group's mesh, torchft across groups,
    a line per step to `args.out`/<group>_<rank>.jsonl, until killed."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.utils._pytree import tree_leaves
    from torchft.checkpointing.pg_transport import PGTransport
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    torch.set_num_threads(1)
    group, rank = int(os.environ["REPLICA_GROUP"]), int(os.environ["RANK"])
    dist.init_process_group("gloo")  # the group's own world: its TCPStore on MASTER_PORT, the manager's too
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("shard",))
    objects = build(args, mesh)
    model, optimizer = objects["model"], objects["optimizer"]

    # As TorchTitan's: torch's state-dict API, whose DTensors are the parameters and optimizer
    # states themselves (a heal receives into them in place), the optimizer's states made first.
    def state_dict() -> dict:
        return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}

    def load_state_dict(loaded: dict) -> None:
        set_model_state_dict(model, loaded["model"])
        set_optimizer_state_dict(model, optimizer, loaded["optim"])

    timeout = timedelta(seconds=60)
    pg = ProcessGroupGloo(timeout=timeout)
    manager = Manager(pg=pg, load_state_dict=load_state_dict, state_dict=state_dict, min_replica_size=1,
                      replica_id=f"group{group}", rank=rank, world_size=dist.get_world_size(), timeout=timeout,
                      # the quorum, and a heal, before the step's forward: healed asynchronously, the load
                      # would race FSDP2's own all-gathers in the forward (measured: a mixed Tensor/DTensor error)
                      use_async_quorum=False,
                      checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu"),
                                                       state_dict=state_dict))

    def average_across_groups(output: torch.Tensor) -> None:
        manager.allreduce(output).wait()

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_all_reduce_hook(average_across_groups)
    log = open(pathlib.Path(args.out) / f"{group}_{rank}.jsonl", "a", buffering=1)
    log.write(json.dumps({"event": "started", "group": group, "rank": rank, "pid": os.getpid(),
                          "time": time.time()}) + "\n")
    state_bytes = sum(t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes
                      for t in tree_leaves(state_dict()) if isinstance(t, torch.Tensor))
    while True:
        started = time.perf_counter()
        manager.start_quorum()
        loss_of(objects, args, manager.current_step(), group * dist.get_world_size() + rank).backward()
        committed = manager.should_commit()
        if committed:
            optimizer.step()
        optimizer.zero_grad()
        log.write(json.dumps({"event": "step", "group": group, "rank": rank, "step": manager.current_step(),
                              "participants": manager.num_participants(), "committed": committed,
                              "time": time.time(), "step_s": time.perf_counter() - started, "rss_mb": peak_rss_mb(),
                              "state_bytes": state_bytes}) + "\n")


# ------------------------------------------------------------------ the driver's side
def available(python: str) -> str | None:
    """Why torchft cannot run under `python` (None: it can)."""
    try:
        probe = subprocess.run([python, "-c", "import torchft, torchft._torchft"], capture_output=True, text=True,
                               timeout=120)
    except OSError as exc:  # (no such file, not executable)
        return f"{python} cannot be run ({exc.strerror})"
    if probe.returncode == 0:
        return None
    return (probe.stderr.strip().splitlines() or ["import torchft failed"])[-1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(args: argparse.Namespace, scratch: pathlib.Path, script: str, flags: list[str], warmup: int,
        records: Callable[[pathlib.Path], list[dict]], wait_for: Callable[..., Any]) -> dict:
    """torchft's figures for the same model and steps as Ringmaster's run (`bench/sharded.py`)."""
    logs = scratch / "torchft"
    logs.mkdir()
    python = args.torchft_python
    address_file = scratch / "lighthouse.address"
    output = open(scratch / "torchft.log", "w")
    procs: list[subprocess.Popen] = []

    def spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        proc = subprocess.Popen([python, script, *argv], env={**os.environ, **env}, start_new_session=True,
                                stdout=output, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    def start_group(group: int) -> list[subprocess.Popen]:
        port = _free_port()
        return [spawn(["--worker", "torchft", "--out", str(logs), *flags],
                      {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2",
                       "LOCAL_RANK": str(rank), "REPLICA_GROUP": str(group), "TORCHFT_LIGHTHOUSE": lighthouse})
                for rank in range(2)]

    try:
        keeper = spawn(["--worker", "lighthouse", "--out", str(address_file)], {})
        lighthouse = wait_for(lambda: address_file.exists() and address_file.read_text(), 120, "torchft's lighthouse",
                              keeper)
        groups = {0: start_group(0), 1: start_group(1)}

        def steps(group: int, participants: int) -> list[dict]:
            return [r for r in records(logs) if r["event"] == "step" and r["group"] == group and r["rank"] == 0
                    and r["committed"] and r["participants"] == participants]

        def alive() -> None:
            for proc in groups[0]:
                if proc.poll() is not None:
                    raise SystemExit(f"a worker of torchft's group 0 exited ({proc.returncode})")

        def watched(check: Callable[[], Any]) -> Callable[[], Any]:
            def look() -> Any:
                alive()
                return check()
            return look

        wait_for(watched(lambda: len(steps(0, 2)) >= warmup + args.steps), 1200, "torchft's timed steps")
        timed = steps(0, 2)[warmup:warmup + args.steps]
        rss = max(r["rss_mb"] for r in records(logs) if r["event"] == "step")
        rounds = []
        for _ in range(args.rounds):  # (a group lost, then added back: each round the same)
            killed = time.time()
            groups[1][1].kill()  # a worker of group 1 lost; torchft restarts its group whole
            groups[1][0].kill()
            for proc in groups[1]:
                proc.wait()
            first = wait_for(watched(lambda: [r for r in steps(0, 1) if r["time"] > killed]), 300,
                             "torchft's surviving group's step")[0]
            restarted = time.time()
            groups[1] = start_group(1)
            after = wait_for(watched(lambda: [r for r in steps(0, 2) if r["time"] > restarted]), 600,
                             "torchft's two groups stepping again")[0]
            before = max((r for r in steps(0, 1) if r["time"] < after["time"]), key=lambda r: r["time"])
            healed = 0  # what each newcomer received: its whole training state (its shards), from its peer
            for rank in range(2):
                mine = wait_for(watched(lambda: [r for r in records(logs) if r["event"] == "step" and r["group"] == 1
                                                 and r["rank"] == rank and r["time"] > restarted]), 120,
                                f"a step of torchft's new group's rank {rank}")
                healed += mine[0]["state_bytes"]
            wait_for(watched(lambda: len([r for r in steps(0, 2) if r["time"] > after["time"]]) >= 2), 600,
                     "two more steps of torchft's two groups")  # (the next round starts from a job in step)
            rounds.append({"lost_to_first_step_s": first["time"] - killed, "pause_s": after["time"] - before["time"],
                           "healed_mb": healed / 2**20, "restart_to_joined_s": after["time"] - restarted})
    except SystemExit as exc:
        raise SystemExit(f"{exc}; torchft's workers said:\n{(scratch / 'torchft.log').read_text()[-6000:]}") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        output.close()
    import statistics

    return {"times": [r["step_s"] for r in timed], "peak_mb": rss,
            **{key: statistics.median(r[key] for r in rounds) for key in rounds[0]},
            **{f"{key}_all": [r[key] for r in rounds] for key in rounds[0]}}


def summary(ours: dict, theirs: dict, base: float, spread: Callable[[dict, str], str]) -> list[str]:
    """The figures' lines for torchft, beside Ringmaster's (`spread`: a figure's median over the
    rounds, with each round's value)."""
    import statistics

    step = statistics.median(theirs["times"])
    return [
        f"torchft 0.2.0 HSDP (lighthouse {', '.join(f'{k}={v}' for k, v in LIGHTHOUSE.items())}): step "
        f"{step * 1e3:.0f} ms ({step / base:.2f}x plain FSDP2), peak memory per worker {theirs['peak_mb']:.0f} MB",
        f"  a group lost: torchft's surviving group's first committed step {spread(theirs, 'lost_to_first_step_s')} "
        f"after the kill (Ringmaster {spread(ours, 'lost_to_first_step_s')})",
        f"  a group added: torchft's survivors' last step alone to their first step with it "
        f"{spread(theirs, 'pause_s')} (Ringmaster {spread(ours, 'pause_s')}); the new group healed "
        f"{theirs['healed_mb']:.1f} MB peer to peer, stepping with the others {spread(theirs, 'restart_to_joined_s')} "
        "after its processes started",
    ]


if __name__ == "__main__":  # (run through bench/sharded.py)
    sys.exit("run bench/sharded.py")
