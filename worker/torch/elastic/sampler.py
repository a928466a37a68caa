"""`hvd.elastic.ElasticSampler`: each sample of an epoch processed once across resets and resizes."""

from __future__ import annotations

from typing import Any, Iterator, Sized

import torch.utils.data

from worker import sampling


class ElasticSampler(torch.utils.data.Sampler):
    """Deals out what is left of the epoch to the current ring.

    Call `record_batch(batch_idx, batch_size)` after each step (every rank, the same step) and
    keep the sampler in a `TorchState`: a commit then holds the set of samples the committed
    model has seen, a restore goes back to it, and after a reset (new world size) iteration
    resumes with only the samples not yet processed, split over the new ring.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` afresh: nothing of it is processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark batch `batch_idx` (of this iteration, `batch_size` per rank) of every rank as processed."""
        self.record_indices(sampling.batch_of_all_ranks(self.remaining_indices, self.num_replicas, batch_idx, batch_size))

    def record_indices(self, indices) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        return self.indices[batch_idx * batch_size: (batch_idx + 1) * batch_size]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Re-deal what is left of the epoch to the current ring (after a sync or resize)."""
        from worker import torch as hvd

        if hvd.is_initialized():
            self.rank, self.num_replicas = hvd.rank(), hvd.size()
        order = sampling.epoch_order(len(self.dataset), self.epoch, self.seed, self.shuffle)
        self.remaining_indices = sampling.remaining(order, self.processed_indices)
        self.indices = sampling.rank_share(self.remaining_indices, self.rank, self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
