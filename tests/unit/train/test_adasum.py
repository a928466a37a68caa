"""Adasum's arithmetic (`ringmaster.torch.adasum`); the collective itself runs on a real ring in
test_e2e's collectives job."""

from __future__ import annotations

import pytest
import torch

from ringmaster.torch import adasum


def test_orthogonal_updates_add_and_equal_ones_average() -> None:
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    assert torch.equal(adasum.combine(a, b), a + b)
    assert torch.allclose(adasum.combine(a, a.clone()), a)
    assert torch.allclose(adasum.combine(a, 3 * a), 2 * a)  # parallel: the mean


def test_a_zero_update_leaves_the_other_as_it_is() -> None:
    a = torch.tensor([0.5, -1.5, 2.0])
    assert torch.equal(adasum.combine(a, torch.zeros(3)), a)
    assert torch.equal(adasum.combine(torch.zeros(3), a), a)


def test_opposite_updates_follow_the_formula() -> None:
    a, b = torch.tensor([1.0, 1.0]), torch.tensor([-1.0, 0.0])
    dot, a2, b2 = -1.0, 2.0, 1.0
    expected = (1 - dot / (2 * a2)) * a + (1 - dot / (2 * b2)) * b
    assert torch.allclose(adasum.combine(a, b), expected)


def test_the_tree_pairs_ranks_in_order_and_an_odd_one_moves_up() -> None:
    parts = [torch.randn(5, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    c = adasum.combine
    expected = c(c(c(parts[0], parts[1]), c(parts[2], parts[3])), parts[4])
    assert torch.equal(adasum.tree(parts), expected)
    with pytest.raises(ValueError, match="at least one"):
        adasum.tree([])


def test_flat_buffers_are_combined_tensor_by_tensor() -> None:
    first = [torch.tensor([1.0, 0.0]), torch.tensor([3.0])]
    second = [torch.tensor([0.0, 1.0]), torch.tensor([3.0])]
    reduced = adasum.reduce_slices([torch.cat(first), torch.cat(second)], [2, 1])
    assert reduced.tolist() == [1.0, 1.0, 3.0]  # orthogonal slice adds, equal slice averages
