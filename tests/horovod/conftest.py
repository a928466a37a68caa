"""What Horovod's test files need from their surroundings here; nothing in them is changed.

- **Muon is left out of `torch.optim.Optimizer.__subclasses__()`.** Three of Horovod's tests
  (`test_broadcast_state`, `test_broadcast_state_options`, `test_force_allreduce`) build every
  optimizer class of `torch.optim` on a model with 1-D parameters (biases). `torch.optim.Muon`,
  new in torch 2.9, takes only 2-D parameters and refuses such a model, so those tests fail with
  Horovod itself on today's torch. The exclusion is here, not in the file, and only for Muon.
- **At a world size that is not a power of two, three tests are not run**:
  `test_horovod_allreduce_prescale`, `test_horovod_reducescatter_prescale` and
  `test_horovod_grouped_reducescatter_prescale`. Each compares the float16 sum of N equal
  float16 tensors with N times their float32 value, with no tolerance for N <= 3. For N = 3 that
  exact value needs 13 significant bits and float16 has 11, so no float16 result can equal it
  (12 of the 17 elements of the first tensor differ, whoever sums them; Horovod's own CI runs
  these files with 2 workers only). They run, and pass, at 2 workers; a failure inside one of
  them would leave the ranks issuing different collectives for the tests after it.
- **Each rank's JUnit report has a file of its own**: a `{rank}` in `--junitxml=PATH` becomes
  the worker's rank (`HOROVOD_RANK`), so one command line serves every worker of the job.
"""

from __future__ import annotations

import os

import pytest
import torch

#: The optimizer classes Horovod's tests cannot build on today's torch (see the docstring).
LEFT_OUT_OPTIMIZERS = ("Muon",)
_all_subclasses = type.__subclasses__


def _optimizers_horovod_can_build(cls: type) -> list[type]:
    return [sub for sub in _all_subclasses(cls) if sub.__name__ not in LEFT_OUT_OPTIMIZERS]


torch.optim.Optimizer.__subclasses__ = classmethod(_optimizers_horovod_can_build)  # type: ignore[method-assign,assignment]


#: Tests whose float16 case cannot pass at a world size that is not a power of two (see the docstring).
EXACT_ONLY_AT_POWERS_OF_TWO = ("test_horovod_allreduce_prescale", "test_horovod_reducescatter_prescale",
                               "test_horovod_grouped_reducescatter_prescale")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    size = int(os.environ.get("HOROVOD_SIZE", "1"))
    if size & (size - 1) == 0:
        return
    left_out = [item for item in items if item.name in EXACT_ONLY_AT_POWERS_OF_TWO]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    path = getattr(config.option, "xmlpath", None)
    if path and "{rank}" in path:
        config.option.xmlpath = path.replace("{rank}", os.environ.get("HOROVOD_RANK", "0"))
