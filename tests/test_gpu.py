"""CUDA paths: skipped cleanly on machines without a GPU (CI has none)."""

from __future__ import annotations

import json

import pytest
import torch

from harness import WORKLOADS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (an NVIDIA GPU); this machine has none")


def test_commit_snapshot_lives_in_host_memory() -> None:
    from ringmaster.checkpoint import snapshot

    state = {"w": torch.ones(4, device="cuda")}
    saved = snapshot(state)
    assert saved["w"].device.type == "cpu"


@pytest.mark.slow
def test_collectives_with_an_nccl_ring(run_job, tmp_path) -> None:
    """One worker per GPU: CPU tensors go over Gloo, CUDA tensors over NCCL."""
    n = torch.cuda.device_count()
    job = run_job("-np", str(n), "python", str(WORKLOADS / "collectives.py"), str(tmp_path), "--cuda")
    assert job.wait(300) == 0, job.output
    result = json.loads((tmp_path / "0.json").read_text())
    assert result["cuda_sum"] == [float(n * (n + 1) / 2)]
