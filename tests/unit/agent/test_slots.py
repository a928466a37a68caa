"""An agent's slots without --slots: the GPUs it sees (CUDA_VISIBLE_DEVICES, else /dev/nvidiaN), else 1."""

from __future__ import annotations

import pytest

from ringmaster.worker.agent.slots import default_slots, visible_gpus


@pytest.mark.parametrize("visible, gpus", [("0,1,2,3", 4), ("2", 1), ("GPU-5d1f,GPU-77aa", 2), ("", 0), ("-1", 0),
                                           ("NoDevFiles", 0), (" 0 , 1 ,", 2)])
def test_cuda_visible_devices_says_which_gpus_a_host_may_use(visible, gpus, tmp_path) -> None:
    (tmp_path / "nvidia0").touch()  # ignored: the variable wins
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": visible}, str(tmp_path)) == gpus
    assert default_slots({"CUDA_VISIBLE_DEVICES": visible}, str(tmp_path)) == max(gpus, 1)


def test_without_the_variable_the_driver_s_device_files_are_counted(tmp_path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps"):
        (tmp_path / name).touch()
    assert visible_gpus({}, str(tmp_path)) == 2
    assert default_slots({}, str(tmp_path / "missing")) == 1
