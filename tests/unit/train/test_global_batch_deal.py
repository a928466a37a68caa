"""A declared global batch: the pure deal (`global_batch.GlobalBatch`) and the sampler and
optimizer in a job of one (the whole ring's arithmetic, with real torch and a real
`DistributedOptimizer`; rings of several ranks are in tests/e2e/test_global_batch.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ringmaster.torch as hvd
from ringmaster.worker.train import sampling
from ringmaster.worker.train.global_batch import GlobalBatch


@given(st.integers(1, 16), st.integers(1, 8), st.integers(1, 20), st.integers(0, 3))
def test_every_ring_takes_each_micro_batch_of_a_step_once(micro_batches, micro, size, step) -> None:
    batch = GlobalBatch(micro_batches * micro, micro)
    order = sampling.epoch_order(batch.size * 4, 1, seed=5, shuffle=True)
    shares = [batch.micro_batches_of(order, step, r, size) for r in range(size)]
    counts = [len(s) for s in shares]
    assert sum(counts) == micro_batches and max(counts) - min(counts) <= 1
    taken = [i for share in shares for m in share for i in m]
    assert taken == batch.step_samples(order, step)  # the same B samples, in order, whatever the size
    assert all(len(m) == micro for share in shares for m in share)


def test_uneven_counts_and_bad_declarations_are_named() -> None:
    batch = GlobalBatch(16, 2)
    assert [len(batch.micro_numbers(r, 3)) for r in range(3)] == [2, 3, 3]
    assert [len(batch.micro_numbers(r, 10)) for r in range(10)].count(0) == 2  # a ring past K: idle ranks
    with pytest.raises(ValueError, match="global_batch_size=10 is not a whole number of micro-batches of "
                                         "micro_batch_size=4"):
        GlobalBatch(10, 4)
    for size, micro in ((0, 1), (8, 0), (True, 1), (8, 2.0)):
        with pytest.raises(ValueError, match="whole number of samples"):
            GlobalBatch(size, micro)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="give global_batch_size and micro_batch_size together"):
        hvd.elastic.ElasticSampler(list(range(8)), global_batch_size=8)
    with pytest.raises(ValueError, match="the data set has only 8 samples"):
        hvd.elastic.ElasticSampler(list(range(8)), global_batch_size=16, micro_batch_size=4)


def test_progress_that_is_not_whole_global_batches_is_refused() -> None:
    batch = GlobalBatch(4, 2)
    order = list(range(12))
    processed = [False] * 12
    assert batch.steps_done(order, processed) == 0
    for i in order[:8]:
        processed[i] = True
    assert batch.steps_done(order, processed) == 2
    processed[8] = True
    with pytest.raises(ValueError, match="not a whole number of global batches of 4"):
        batch.steps_done(order, processed)


def _regression(num: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(num, 1, generator=g)


@pytest.mark.usefixtures("alone")
def test_a_step_of_micro_batches_is_the_mean_over_the_global_batch_and_a_rollback_redoes_its_samples() -> None:
    """A job of one with B = 12 in micro-batches of 3: the DistributedOptimizer accumulates 4
    backward passes and its update equals one step on the mean loss of the same 12 samples;
    a restore in the middle of a step's accumulation goes back to the committed step, whose
    samples are dealt again."""
    x, y = _regression()
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    sampler = hvd.elastic.ElasticSampler(x, seed=7, global_batch_size=12, micro_batch_size=3)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler)
    state.reset()
    assert (sampler.accumulation, sampler.reduction_scale, getattr(optimizer,
                                                                   "backward_passes_per_step")) == (4, 0.25, 4)
    assert sampler.steps_per_epoch == 4
    seen: list[int] = []
    for number, micro_batches in enumerate(sampler.steps()):
        optimizer.zero_grad()
        for micro in micro_batches:
            torch.nn.functional.mse_loss(model(x[micro]), y[micro]).backward()
        optimizer.step()
        step_samples = [i for m in micro_batches for i in m]
        plain.zero_grad()
        torch.nn.functional.mse_loss(reference(x[step_samples]), y[step_samples]).backward()
        plain.step()
        torch.testing.assert_close(model.weight, reference.weight, rtol=1e-6, atol=1e-7)
        sampler.record_step()
        seen += step_samples
        if number == 1:
            state.commit()
            break
    assert sampler.step == 2 and sampler.processed_num == 24 and sorted(seen) == sorted(set(seen))
    committed = model.weight.detach().clone()

    third = next(iter(sampler.steps()))
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x[third[0]]), y[third[0]]).backward()  # one micro-batch of four, then a failure
    state.restore()
    state.reset()  # (as the elastic loop does on re-entering)
    assert sampler.step == 2 and sampler.processed_num == 24
    torch.testing.assert_close(model.weight.detach(), committed)
    assert next(iter(sampler.steps())) == third  # the rolled-back step's samples, dealt again
    for micro_batches in sampler.steps():
        optimizer.zero_grad()
        for micro in micro_batches:
            torch.nn.functional.mse_loss(model(x[micro]), y[micro]).backward()  # no "computed 5 times" from before
        optimizer.step()
        sampler.record_step()
        seen += [i for m in micro_batches for i in m]
    assert sorted(seen) == sorted(sampler.processed_indices) and len(seen) == 48  # each sample once
    with pytest.raises(ValueError, match="all recorded"):
        sampler.record_step()
    with pytest.raises(TypeError, match="call record_step"):
        sampler.record_batch(0, 3)


@pytest.mark.usefixtures("alone")
def test_a_sampler_without_a_global_batch_keeps_horovods_average() -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), backward_passes_per_step=2)
    sampler = hvd.elastic.ElasticSampler(list(range(8)))
    hvd.elastic.TorchState(model, optimizer, sampler=sampler).reset()
    assert getattr(optimizer, "backward_passes_per_step") == 2 and getattr(optimizer, "_hvd_sum_scale") is None
    with pytest.raises(TypeError, match="needs a global batch"):
        list(sampler.steps())
