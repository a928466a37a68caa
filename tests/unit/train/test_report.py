"""`hvd.report`: the loss, and for a pool's goodput policy the batch per worker and the gradient
noise scale, which go out with the next heartbeat; bad values are refused naming the argument."""

from __future__ import annotations

import pytest

import ringmaster.torch as hvd
from ringmaster.torch.basics import context


def test_report_carries_the_loss_batch_and_noise_scale(alone) -> None:
    hvd.report(0.5, batch_size=32, noise_scale=4000.0)
    stats = context().figures.stats()
    assert (stats.has_loss, stats.loss, stats.batch_size, stats.noise_scale) == (True, 0.5, 32, 4000.0)
    hvd.report(0.25)  # the hints stay as they were
    assert context().figures.stats().batch_size == 32


@pytest.mark.parametrize("kwargs, named", [({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"),
                                           ({"noise_scale": float("nan")}, "noise_scale"),
                                           ({"noise_scale": -1.0}, "noise_scale")])
def test_report_refuses_what_is_not_a_batch_or_a_noise_scale(alone, kwargs, named) -> None:
    with pytest.raises(ValueError, match=named):
        hvd.report(**kwargs)
