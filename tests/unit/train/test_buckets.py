"""Bucket planning and the fusion threshold (pure), and the hooks in a job of one: gradients are
handed over while backward runs, and a second backward pass before step() is refused as Horovod
refuses it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ringmaster.torch as hvd
from ringmaster.torch.buckets import plan_buckets
from ringmaster.worker.train import flat
from ringmaster.worker.train.op_queue import DEFAULT_FUSION_THRESHOLD_BYTES, fusion_threshold


def test_buckets_follow_reverse_order_split_by_kind_and_threshold() -> None:
    a, b, c = torch.zeros(4), torch.zeros(4), torch.zeros(4)  # 16 bytes each
    half = torch.zeros(4, dtype=torch.float16)
    assert [[id(t) for t in g] for g in plan_buckets([a, b, c], 32)] == [[id(c), id(b)], [id(a)]]
    assert [[id(t) for t in g] for g in plan_buckets([a, half, b], 1 << 20)] == [[id(b), id(a)], [id(half)]]
    assert len(plan_buckets([a, b, c], 0)) == 3  # 0: no fusion, one tensor per bucket
    w1, w2 = torch.zeros(1 << 19), torch.zeros(1 << 19)  # 2 MB each
    # The first bucket takes tensors until it holds 1 MB (the one crossing the mark included), so it
    # goes out during backward; then up to the threshold.
    assert [[id(t) for t in g] for g in plan_buckets([w1, w2, a], 64 << 20)] == [[id(a), id(w2)], [id(w1)]]
    w0 = torch.zeros(1 << 17)  # 0.5 MB
    # 2 x 0.5 MB reach it
    assert [len(g) for g in plan_buckets([w1, w2, w0, w0.clone(), w0.clone()], 64 << 20)] == [2, 3]
    big = torch.zeros(100)
    assert [len(g) for g in plan_buckets([a, big, b], 32)] == [1, 1, 1]  # too big: a bucket of its own


def test_packing_scales_and_casts_in_one_pass() -> None:
    buffer = torch.zeros(6)
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([[3.0, 4.0], [5.0, 6.0]])
    views = list(flat.views(buffer, [a, b]))
    flat.pack_scaled([a, b], views, 0.5)
    assert buffer.tolist() == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    flat.pack_scaled([a, b], views, 1.0)
    assert buffer.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    half = torch.zeros(6, dtype=torch.float16)
    flat.pack_scaled([a, b], list(flat.views(half, [a, b])), 1.0)  # cast on the way
    assert half.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_the_fusion_threshold_comes_from_the_environment() -> None:
    assert fusion_threshold({}) == DEFAULT_FUSION_THRESHOLD_BYTES == 64 * 1024 * 1024
    assert fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "1024"}) == 1024
    assert fusion_threshold({"RINGMASTER_FUSION_THRESHOLD": "0", "HOROVOD_FUSION_THRESHOLD": "9"}) == 0
    with pytest.raises(ValueError, match="HOROVOD_FUSION_THRESHOLD='64MB' is not a number of bytes"):
        fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "64MB"})


def test_hooks_hand_gradients_over_during_backward(alone) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    optimizer: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                              named_parameters=model.named_parameters())
    model(torch.ones(2, 3)).sum().backward()
    assert optimizer._hvd_buckets.in_flight == len(optimizer._hvd_buckets.buckets)  # all handed over already
    expected = [p.grad.clone() for p in model.parameters()]
    optimizer.synchronize()
    assert optimizer._hvd_buckets.in_flight == 0
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected))  # a job of one: unchanged
    with optimizer.skip_synchronize():
        optimizer.step()
    model(torch.ones(2, 3)).sum().backward()
    with pytest.raises(RuntimeError, match="backward_passes_per_step is 1: pass backward_passes_per_step=2"):
        model(torch.ones(2, 3)).sum().backward()


def test_after_the_first_step_buckets_follow_the_order_gradients_became_ready(alone, monkeypatch) -> None:
    """Declared head first, run body first: gradients become ready head first, the reverse of
    what the declaration suggests. After the first step the buckets are rebuilt in the order
    seen (in a job of one, its own; in a ring, rank 0's), and stay so."""
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "0")  # one tensor per bucket: the order shows
    model = torch.nn.ModuleDict({"head": torch.nn.Linear(4, 1), "body": torch.nn.Linear(3, 4)})
    optimizer: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                              named_parameters=model.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    buckets = optimizer._hvd_buckets

    def step() -> list[str]:
        optimizer.zero_grad()
        model["head"](model["body"](torch.ones(2, 3))).sum().backward()
        optimizer.step()
        return [names[i] for i in buckets.order]

    assert [names[i] for i in buckets.order] == ["body.bias", "body.weight", "head.bias", "head.weight"]
    ready = step()
    assert ready[:2] == ["head.bias", "head.weight"] or ready[:2] == ["head.weight", "head.bias"], ready
    assert set(ready[2:]) == {"body.bias", "body.weight"}
    assert step() == ready and step() == ready  # agreed once per ring
    assert all(len(b.params) == 1 for b in buckets.buckets)


def test_the_newest_optimizer_of_a_parameter_hears_its_gradients(alone) -> None:
    model = torch.nn.Linear(3, 1)
    first: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    second: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=2)
    model(torch.ones(1, 3)).sum().backward()
    model(torch.ones(1, 3)).sum().backward()  # the first optimizer (k=1) no longer counts these
    assert first._hvd_buckets.in_flight == 0 and second._hvd_buckets.in_flight == 1
    second.step()


def test_an_optimizer_with_its_own_zero_grad_keeps_it(alone) -> None:
    class Plain(torch.optim.SGD):
        def zero_grad(self) -> None:  # type: ignore[override]  # no set_to_none, as some optimizers have
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None

    model = torch.nn.Linear(2, 1)
    optimizer: Any = hvd.DistributedOptimizer(Plain(model.parameters(), lr=0.1),
                                              named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_distributed_optimizer_checks_its_arguments_as_horovods_does(alone) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="one or more model parameters were not named"):
        hvd.DistributedOptimizer(sgd, named_parameters=list(model.named_parameters())[:1])
    with pytest.raises(ValueError, match="sequence of tuples"):
        hvd.DistributedOptimizer(sgd, named_parameters=[["0.weight", model[0].weight]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="Found duplicates: w"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("w", p) for p in model.parameters()])
    with pytest.raises(ValueError, match="groups should be a non-negative integer"):
        hvd.DistributedOptimizer(sgd, groups=-1)
    wrapped: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert sorted(wrapped._parameter_names.values()) == [f"allreduce.noname.0.{j}" for j in range(4)]
    named: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                          named_parameters=model.named_parameters(), process_set=hvd.global_process_set)
    assert named._parameter_names[model[1].bias] == "1.bias"
    model(torch.ones(2, 3)).sum().backward()
    named.synchronize()
    with pytest.warns(UserWarning, match="called without optimizer.skip_synchronize"):
        named.step()


def test_sparse_gradients_are_reduced_as_sparse_tensors_on_a_ring_and_stay_sparse() -> None:
    """Two ranks, an embedding with sparse gradients beside a dense layer: the dense gradients go
    out in their bucket, the sparse ones through the `sparse` reduction (every rank's indices and
    values gathered, then averaged), and each equals the average of the dense gradients."""
    from gloo_rings import on_ranks

    from ringmaster.torch import operations as ops
    from ringmaster.torch.buckets import GradientBuckets

    def work(comm: Any) -> tuple[list[float], list[float], bool]:
        embedding, head = torch.nn.Embedding(6, 2, sparse=True), torch.nn.Linear(2, 1)
        with torch.no_grad():  # (the same on both ranks: threads share torch's seed)
            embedding.weight.copy_(torch.arange(12.0).view(6, 2))
            head.weight.copy_(torch.tensor([[0.5, -2.0]]))
        params: list[torch.Tensor] = [*embedding.parameters(), *head.parameters()]

        def reduce_sparse(grads: list[torch.Tensor]) -> list[torch.Tensor]:
            out = []
            for g in grads:
                g = g.coalesce()
                indices = comm.ops.submit(ops.allgather(g.indices().t().contiguous(), None)).outcome()
                values = comm.ops.submit(ops.allgather(g.values(), None)).outcome()
                out.append(torch.sparse_coo_tensor(indices.t(), values / comm.size, g.shape, check_invariants=True))
            return out

        buckets = GradientBuckets(params, 1 << 20, 1, lambda dtype: dtype, lambda: comm, lambda: 1.0,
                                  lambda: 1.0 / comm.size, sparse=reduce_sparse)
        head(embedding(torch.tensor([[comm.rank, 3]]))).sum().backward()
        buckets.synchronize()
        return embedding.weight.grad.to_dense().flatten().tolist(), head.weight.grad.flatten().tolist(), \
            embedding.weight.grad.is_sparse

    (sparse0, dense0, kept0), (sparse1, dense1, kept1) = on_ranks(2, work)
    assert kept0 and kept1 and sparse0 == sparse1 and dense0 == dense1
    head_weight = torch.tensor([0.5, -2.0])
    grid = torch.tensor(sparse0).view(6, 2)
    # rank 0 looked up rows 0 and 3, rank 1 rows 1 and 3: each lookup adds the head's weight to its
    # row, and the average over 2 ranks halves it
    assert torch.allclose(grid[0], head_weight / 2) and torch.allclose(grid[1], head_weight / 2)
    assert torch.allclose(grid[3], head_weight) and grid[[2, 4, 5]].abs().sum() == 0
