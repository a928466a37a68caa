"""The decision to leave out the NCCL ring where a host's workers outnumber its GPUs."""

from ringmaster.worker.train.gpu_sharing import nccl_refusal


def test_a_gpu_per_worker_keeps_the_nccl_ring() -> None:
    assert nccl_refusal("node1", 8, 8) is None
    assert nccl_refusal("node1", 2, 8) is None


def test_more_workers_than_gpus_are_refused_with_the_host_the_count_and_the_fix() -> None:
    message = nccl_refusal("node1", 3, 2)
    assert message is not None
    assert "3 workers of this job share host node1's 2 GPU(s)" in message
    assert "node1:2" in message and "-np 2" in message and "CPU" in message


def test_a_host_without_gpus_is_refused_too() -> None:
    assert nccl_refusal("cpu-box", 1, 0) is not None
