"""CUDA paths: skipped cleanly on machines without a GPU (CI has none)."""

from __future__ import annotations

import json

import pytest
import torch
from harness import WORKLOADS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (an NVIDIA GPU); this machine has "
                                                                      "none")


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
    """One worker per GPU: CPU tensors go over Gloo, CUDA tensors over NCCL; the workers are forked
    from the agent's template, as by default (a template that had touched CUDA would hand out
    workers whose first CUDA call fails)."""
    n = torch.cuda.device_count()
    job = run_job("-np", str(n), "python", str(WORKLOADS / "collectives.py"), str(tmp_path), "--cuda")
    assert job.wait(300) == 0, job.output
    assert len(job.events("template.forked")) == n and not job.events("template.off"), job.story()
    result = json.loads((tmp_path / "0.json").read_text())
    assert result["cuda_sum"] == [float(n * (n + 1) / 2)]
    assert result["cuda_buckets"] is True  # gradient buckets reduced over NCCL during backward


@pytest.mark.slow
def test_horovod_ops_on_cuda_tensors_agree_with_the_cpu_path(run_job, tmp_path) -> None:
    """Every op of Horovod's API, each dtype it allows, on CUDA tensors (the NCCL ring) gives what
    the same op gives on CPU tensors (the Gloo ring, checked against single-process references by
    test_horovod_ops.py), and leaves its results on the GPU. One worker per GPU: NCCL refuses two
    ranks on one GPU, so a machine of one GPU checks the paths on a ring of one."""
    n = torch.cuda.device_count()
    job = run_job("-np", str(n), "python", str(WORKLOADS / "horovod_ops_cuda.py"), str(tmp_path))
    assert job.wait(300) == 0, job.output
    for rank in range(n):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        assert result["size"] == n and result["nccl"]
        failed = {case: outcome for case, outcome in result["cases"].items() if outcome != "ok"}
        assert not failed and len(result["cases"]) >= 100, json.dumps(failed, indent=1)


SHARED_GPU_SCRIPT = """
import json, sys, torch
import ringmaster.torch as hvd
hvd.init()
result = {"cpu": hvd.allreduce(torch.ones(1), op=hvd.Sum).item()}
try:
    hvd.allreduce(torch.ones(1, device="cuda"))
    result["cuda"] = "no error"
except ValueError as exc:
    result["cuda"] = str(exc)
result["cpu_after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
open(sys.argv[1] + f"/{hvd.rank()}.json", "w").write(json.dumps(result))
"""


@pytest.mark.slow
def test_more_workers_than_gpus_train_on_the_cpu_and_a_cuda_collective_says_what_to_change(run_job, tmp_path) -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected", from inside the first CUDA
    collective): with more workers on a host than it has GPUs, the CPU ring works and a CUDA
    collective is refused at once, naming the host, its GPUs and the fix."""
    n = torch.cuda.device_count() + 1
    script = tmp_path / "shared_gpu.py"
    script.write_text(SHARED_GPU_SCRIPT)
    job = run_job("-np", str(n), "python", str(script), str(tmp_path))
    assert job.wait(300) == 0, job.output
    for rank in range(n):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        assert result["cpu"] == result["cpu_after"] == n
        assert f"{n} workers of this job share host localhost's {n - 1} GPU(s)" in result["cuda"], result["cuda"]
        assert f"-np {n - 1}" in result["cuda"]
