"""The training library in one process (a job of one: no Ringmaster environment).

Commit/restore round trips for modules, optimizers, samplers and plain attributes; the
optimizer wrapper keeps its class; `elastic.run` returns the function's result.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ringmaster.torch as hvd
from ringmaster.checkpoint.directory import CheckpointDirectory

pytestmark = pytest.mark.usefixtures("alone")


def test_a_script_alone_is_a_job_of_one() -> None:
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_size()) == (0, 1, 0, 1)
    assert hvd.allreduce(torch.tensor([3.0])).item() == 3.0
    assert hvd.allgather(torch.ones(2, 2)).shape == (2, 2)
    assert hvd.broadcast_object({"a": 1}) == {"a": 1}


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=0.01),
])
def test_restore_brings_back_the_committed_model_and_optimizer(make_optimizer) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = hvd.DistributedOptimizer(make_optimizer(model.parameters()), named_parameters=model.named_parameters())

    def step() -> None:
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).sum().backward()
        optimizer.step()

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=3, notes={"lr": [0.1]})
    step()
    state.commit()
    committed_model = {k: v.clone() for k, v in model.state_dict().items()}
    committed_opt = optimizer.state_dict()
    committed_buffers = {k: {n: t.clone() for n, t in v.items() if torch.is_tensor(t)}
                         for k, v in committed_opt["state"].items()}
    for _ in range(3):
        step()
    state.epoch = 9
    state.notes["lr"].append(0.5)
    assert not torch.equal(model.weight, committed_model["weight"])
    state.restore()
    for name, value in model.state_dict().items():
        assert torch.equal(value, committed_model[name])
    for key, buffers in committed_buffers.items():
        for name, tensor in buffers.items():
            assert torch.equal(optimizer.state_dict()["state"][key][name], tensor)
    assert state.epoch == 3 and state.notes == {"lr": [0.1]}
    # the snapshot is not aliased by the restored optimizer: training on does not change it
    step()
    state.restore()
    for name, value in model.state_dict().items():
        assert torch.equal(value, committed_model[name])


def test_sampler_state_rolls_back() -> None:
    dataset = list(range(20))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    state = hvd.elastic.TorchState(sampler=sampler)
    sampler.record_batch(0, 4)
    state.commit()
    sampler.record_batch(1, 4)
    assert len(sampler.processed_indices) == 8
    state.restore()
    assert sampler.processed_indices == {0, 1, 2, 3}
    sampler.reset()
    assert list(sampler) == list(range(4, 20))


def test_commit_count_goes_back_with_a_restore() -> None:
    state = hvd.elastic.ObjectState(step=0)
    for _ in range(3):
        state.step += 1
        state.commit()
    state.step += 1
    state.restore()
    assert (state.step, state.commit_count) == (3, 3)


def test_distributed_optimizer_keeps_its_class_for_schedulers() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), op=hvd.Sum)
    assert isinstance(optimizer, torch.optim.SGD)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.5
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="unknown reduction op"):
        hvd.allreduce(torch.ones(1), op="median")


def test_elastic_run_returns_the_result_and_calls_reset_callbacks_only_on_reset() -> None:
    calls = []
    state = hvd.elastic.ObjectState(value=1)
    state.register_reset_callbacks([lambda: calls.append("reset")])

    @hvd.elastic.run
    def train(state, factor):
        state.value *= factor
        state.commit()
        return state.value

    assert train(state, 5) == 5
    assert calls == []


def test_commits_reuse_host_buffers_and_restore_the_scheduled_learning_rate() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0)

    def step() -> None:
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        scheduler.step()

    step()
    state.commit()  # the optimizer now has momentum buffers: a new layout, allocated once
    allocations = state.snapshot.allocations
    momentum = optimizer.state[model.weight]["momentum_buffer"]
    for _ in range(5):
        step()
        state.commit()
    assert state.snapshot.allocations == allocations
    committed_lr = optimizer.param_groups[0]["lr"]
    committed_momentum = momentum.clone()
    step()
    step()
    state.restore()
    assert optimizer.param_groups[0]["lr"] == committed_lr
    assert optimizer.state[model.weight]["momentum_buffer"] is momentum  # restored in place
    assert torch.equal(momentum, committed_momentum)


def test_a_job_of_one_resumes_from_its_durable_checkpoint(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RINGMASTER_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("RINGMASTER_CHECKPOINT_EVERY", "2")

    def make():
        torch.manual_seed(len(list(tmp_path.iterdir())))  # different initial weights per start
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
        return model, optimizer, sampler, hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler,
                                                                 step=0)

    model, optimizer, sampler, state = make()

    @hvd.elastic.run
    def train(state, steps):
        while state.step < steps:
            optimizer.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            optimizer.step()
            sampler.record_batch(state.step, 1)
            state.step += 1
            state.commit()

    train(state, 5)  # checkpoints at commits 2 and 4; the end writes commit 5
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    assert [p.name for p in CheckpointDirectory(tmp_path).checkpoints()][0] == "step-000000000005"

    model, optimizer, sampler, fresh = make()
    assert not torch.equal(model.weight, saved["weight"])
    train(fresh, 5)  # nothing left to do: it resumes at step 5
    assert fresh.step == 5 and fresh.commit_count == 5
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[name])
    assert sampler.processed_indices == {0, 1, 2, 3, 4}
    assert optimizer.state[model.weight]["step"] == 5


def test_a_checkpoint_of_another_model_is_named_with_what_differs(tmp_path, monkeypatch) -> None:
    from ringmaster.worker.train.errors import CheckpointMismatchError

    monkeypatch.setenv("RINGMASTER_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("RINGMASTER_CHECKPOINT_EVERY", "1")

    def job(model: torch.nn.Module) -> None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

        @hvd.elastic.run
        def train(state):
            while state.step < 2:
                optimizer.zero_grad()
                model(torch.ones(2, model[0].in_features)).sum().backward()
                optimizer.step()
                state.step += 1
                state.commit()

        train(state)

    job(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)))
    with pytest.raises(CheckpointMismatchError) as info:
        job(torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 1), torch.nn.ReLU()))
    message = str(info.value)
    assert "the checkpoint of step 2 in" in message and "does not fit this model" in message
    assert "model.0.weight has shape [4, 3] float32 in the checkpoint and [4, 5] float32 here" in message
    assert "move that folder away" in message


def test_fit_names_missing_extra_and_reshaped_entries() -> None:
    from ringmaster.checkpoint import fit

    saved = {"w": torch.zeros(2, 2), "b": torch.zeros(2), "old": torch.zeros(1), "epoch": 3}
    live = {"w": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.float64), "new": torch.zeros(1), "epoch": 9}
    found = fit.differences(saved, live, "model")
    assert "model lacks 'new' in the checkpoint" in found
    assert "model has 'old' in the checkpoint that this model does not" in found
    assert "model.w has shape [2, 2] float32 in the checkpoint and [2, 3] float32 here" in found
    assert "model.b has shape [2] float32 in the checkpoint and [2] float64 here" in found
    assert len(found) == 4  # the epoch differs in value only: that is what checkpoints are for
    assert fit.differences({"a": [1, 2]}, {"a": [1, 2, 3]}) == []  # plain lists of values may change


@pytest.mark.parametrize("compression", ["none", "fp16", "bf16"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_are_reduced_through_buffers_kept_across_steps(compression, set_to_none) -> None:
    """A job of one: averaging over one worker leaves the gradients as they are (fp16: rounded
    to half precision on the wire, bf16 to bfloat16), and the fusion buffer (the wire: cast into
    as it is packed) is allocated once, not per step; gradients zeroed in place work alike."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 1))
    optimizer: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                              named_parameters=model.named_parameters(),
                                              compression=getattr(hvd.Compression, compression))
    addresses = None
    for _ in range(3):
        optimizer.zero_grad(set_to_none=set_to_none)
        model(torch.randn(4, 5)).sum().backward()
        expected = [p.grad.clone() for p in model.parameters()]
        optimizer.synchronize()
        for p, e in zip(model.parameters(), expected):
            wire = {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[compression]
            want = e.to(wire).float()
            assert torch.equal(p.grad, want)
        (bucket,) = optimizer._hvd_buckets.buckets  # 4 small tensors: one bucket under the 64 MiB threshold
        assert addresses is None or bucket.wire.data_ptr() == addresses
        addresses = bucket.wire.data_ptr()
        assert bucket.wire.dtype == wire
    with optimizer.skip_synchronize():
        optimizer.step()
