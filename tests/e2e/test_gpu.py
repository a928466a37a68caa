"""CUDA paths: skipped cleanly on machines without a GPU (CI has none)."""

from __future__ import annotations

import json

import pytest
import torch

from harness import WORKLOADS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (an NVIDIA GPU); this machine has none")


def test_a_commit_of_cuda_tensors_lives_in_host_memory_and_goes_back_to_the_device() -> None:
    from ringmaster.checkpoint.memory import HostSnapshot

    snapshot = HostSnapshot()
    snapshot.capture({"model": {"w": torch.arange(4.0, device="cuda")}})
    assert all(buffer.device.type == "cpu" for buffer in snapshot.buffers)
    restored = snapshot.materialize("model")
    assert restored["w"].device.type == "cuda" and restored["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    live = {"w": torch.zeros(4, device="cuda")}
    assert snapshot.copy_into("model", live) and live["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.slow
def test_collectives_with_an_nccl_ring(run_job, tmp_path) -> None:
    """One worker per GPU: CPU tensors go over Gloo, CUDA tensors over NCCL."""
    n = torch.cuda.device_count()
    job = run_job("-np", str(n), "python", str(WORKLOADS / "collectives.py"), str(tmp_path), "--cuda")
    assert job.wait(300) == 0, job.output
    result = json.loads((tmp_path / "0.json").read_text())
    assert result["cuda_sum"] == [float(n * (n + 1) / 2)]
    assert result["cuda_buckets"] is True  # gradient buckets reduced over NCCL during backward
