"""A plain torch.distributed script (torchrun's environment contract, no Ringmaster import).

With --fail-once MARKER, rank 1 exits 1 the first time (creating MARKER), to show that plain
scripts are restarted as a whole, as torchrun does (with --max-restarts). With --last-exit CODE,
rank 1 exits with CODE once every rank has done its work and rank 0's process is gone.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-once", default=None)
    parser.add_argument("--last-exit", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and size == int(os.environ["WORLD_SIZE"])
    if args.fail_once and rank == 1 and not os.path.exists(args.fail_once):
        open(args.fail_once, "w").close()
        return 1
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    print(f"plain rank {rank}/{size} local {os.environ['LOCAL_RANK']}/{os.environ['LOCAL_WORLD_SIZE']} "
          f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']} sum {total.item():g}", flush=True)
    rank0 = torch.tensor([os.getpid() if rank == 0 else 0])
    dist.all_reduce(rank0)
    dist.destroy_process_group()
    if args.last_exit and rank == 1:
        import select

        try:  # until rank 0 has exited (its pidfd turns readable), at most 30 s
            pidfd = os.pidfd_open(int(rank0.item()))
        except ProcessLookupError:
            return args.last_exit  # gone already
        select.select([pidfd], [], [], 30)
        os.close(pidfd)
        return args.last_exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
