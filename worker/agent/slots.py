"""How many slots an agent offers when `--slots` is not given: the GPUs it sees, else 1.

Counted without importing torch or CUDA (the agent stays light): `CUDA_VISIBLE_DEVICES` when
it is set (Slurm, Kubernetes' device plugin and container runtimes set it to the devices the
host's processes may use), else the NVIDIA device files the kernel driver made.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

_DEVICE_FILE = re.compile(r"nvidia[0-9]+")


def visible_gpus(environ: Mapping[str, str], device_dir: str = "/dev") -> int:
    """GPUs this host's processes may use: the entries of `CUDA_VISIBLE_DEVICES` (empty or
    `-1`/`NoDevFiles`: none), else the `/dev/nvidiaN` files."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if not entries or entries[0] in ("-1", "NoDevFiles"):
            return 0
        return len(entries)
    try:
        return sum(1 for name in os.listdir(device_dir) if _DEVICE_FILE.fullmatch(name))
    except OSError:
        return 0


def default_slots(environ: Mapping[str, str], device_dir: str = "/dev") -> int:
    """The slots of a host whose agent was not given `--slots`: one per GPU, else 1."""
    return visible_gpus(environ, device_dir) or 1
