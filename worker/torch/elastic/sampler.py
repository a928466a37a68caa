"""`hvd.elastic.ElasticSampler`: each sample of an epoch processed once across resets and resizes."""

from __future__ import annotations

from typing import Any, Iterator, Sized

import torch
import torch.utils.data

from ringmaster.torch.basics import is_initialized, rank, size
from ringmaster.torch.elastic.groups import replica_group
from ringmaster.worker.train import sampling
from ringmaster.worker.train.global_batch import GlobalBatch

#: How a sampler deals an epoch: to every rank, or to every replica group.
DEALS = ("rank", "group")


class ElasticSampler(torch.utils.data.Sampler):
    """Deals out what is left of the epoch to the current ring.

    Call `record_batch(batch_idx, batch_size)` after each step (every rank, the same step) and
    keep the sampler in a `TorchState`: a commit then holds the set of samples the committed
    model has seen, a restore goes back to it, and after a reset (new world size) iteration
    resumes with only the samples not yet processed, split over the new ring. As in Horovod,
    `processed_num` counts the samples of the epoch the ring has processed, and each
    `record_batch` is one step of every rank, the next of the current deal (`batch_idx` names it
    for the reader; the sampler counts the steps itself, so a step recorded after a restore
    is the one after the commit).

    `by="rank"` gives every rank its own samples, as data parallelism and HSDP deal them (in a
    job of replica groups, every rank of every group: TorchTitan's rule for FSDP).
    `by="group"` deals them to the replica groups (`--group-size`) instead: every member of a
    group gets the group's samples, as parallelism that splits one batch's work inside the
    group (tensor parallelism) needs.

    `global_batch_size=B, micro_batch_size=m` keeps the job's training independent of its world
    size: every optimizer step is the mean over the same B samples whatever the size of the ring
    (`worker/train/global_batch.py`). Iterate `steps()` (this rank's micro-batches of each
    step), call `record_step()` after each optimizer step, and keep the sampler and a
    `DistributedOptimizer` in one `TorchState`: at every reset the state sets the optimizer's
    accumulation to this rank's micro-batches and its reduction to the mean over the step's.
    With `exact=True` (the default) the step's gradients are summed in float64 and rounded once,
    so a job that met failures and resizes computes the same bits as a fault-free one; `exact=False`
    sums them in their own dtype (half the bytes on the wire, no float64 copy of the gradients),
    equal up to the order of the sums, which a network with kinks (ReLU, max-pooling) may amplify.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0, by: str = "rank",
                 global_batch_size: int | None = None, micro_batch_size: int | None = None, exact: bool = True) -> None:
        if by not in DEALS:
            raise ValueError(f"ElasticSampler(by={by!r}): deal by {' or '.join(map(repr, DEALS))}")
        if (global_batch_size is None) != (micro_batch_size is None):
            raise ValueError("ElasticSampler: give global_batch_size and micro_batch_size together (a global batch is "
                             "cut into micro-batches that the ranks share), or neither")
        #: The declared global batch, or None (Horovod's semantics: a batch per rank).
        self.global_batch = None if global_batch_size is None else GlobalBatch(global_batch_size, micro_batch_size or 0)
        #: With a global batch: the step's gradients summed in float64 and rounded once, the same
        #: bits at any world size (False: summed in their dtype, equal up to the order of the sums).
        self.exact = exact
        if self.global_batch is not None and self.global_batch.size > len(dataset):
            raise ValueError(f"ElasticSampler(global_batch_size={self.global_batch.size}): the data set has only "
                             f"{len(dataset)} samples; give a global batch of at most that many")
        self.by = by
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        #: Which samples of this epoch the ring has processed: a bool tensor, so a commit copies
        #: it as bytes (a set or list of indices would be deep-copied element by element).
        self.processed = torch.zeros(len(dataset), dtype=torch.bool)
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []
        self._recorded = 0  # samples per rank (steps, with a global batch) recorded since the last deal (`reset`)
        self._first_step = 0  # with a global batch: the epoch's step the current deal starts at
        self._order: list[int] = []
        self.reset()

    @property
    def processed_num(self) -> int:
        """How many samples of this epoch the ring has processed (Horovod's counter)."""
        return int(self.processed.sum())

    @property
    def processed_indices(self) -> set[int]:
        """The indices of this epoch that every rank has recorded as processed (committed with the state)."""
        return set(torch.nonzero(self.processed).flatten().tolist())

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` afresh: nothing of it is processed yet."""
        self.epoch = epoch
        self.processed.zero_()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark the ring's next step as processed: the next `batch_size` samples (per rank, or per
        group with `by="group"`) of every rank's (group's) share of the current deal. Called once
        per step in order, that is batch `batch_idx` of the iteration."""
        if self.global_batch is not None:
            raise TypeError("record_batch: this sampler has a global batch; call record_step() after each optimizer "
                            "step")
        if batch_size < 0:
            raise ValueError(f"record_batch(batch_size={batch_size}): give the samples per rank of the step, 0 or more")
        taken = sampling.samples_of_all_ranks(self.remaining_indices, self.num_replicas, self._recorded, batch_size)
        self._recorded += batch_size
        self.record_indices(taken)

    def record_indices(self, indices) -> None:
        """Mark these dataset `indices` as processed this epoch (committed with the state)."""
        index = [int(i) for i in indices]
        if index:
            self.processed[index] = True

    # ---------------------------------------------------------------- with a global batch
    def _declared(self, what: str) -> GlobalBatch:
        if self.global_batch is None:
            raise TypeError(
                f"{what} needs a global batch: ElasticSampler(..., global_batch_size=B, micro_batch_size=m)"
            )
        return self.global_batch

    @property
    def step(self) -> int:
        """The epoch's next global step (0-based): the first one not yet recorded."""
        self._declared("sampler.step")
        return self._first_step + self._recorded

    @property
    def steps_per_epoch(self) -> int:
        """Whole global steps in an epoch (the last len(dataset) mod B samples are not used)."""
        return self._declared("sampler.steps_per_epoch").steps_per_epoch(len(self.dataset))

    @property
    def accumulation(self) -> int:
        """This rank's micro-batches per step in the current generation (0 in a ring larger than
        the step's micro-batches)."""
        return len(self._declared("sampler.accumulation").micro_numbers(self.rank, self.num_replicas))

    @property
    def sharing(self) -> int:
        """The workers that compute each micro-batch: a replica group's members with `by="group"`, else 1."""
        return max(1, size() // max(1, self.num_replicas)) if self.by == "group" and is_initialized() else 1

    @property
    def reduction_scale(self) -> float:
        """What the ring's summed gradients are multiplied by to make the mean over the step's
        samples: one over the step's micro-batches, times the members that share each of them
        (a replica group's size with `by="group"`, whose members all compute its micro-batches)."""
        return 1.0 / (self._declared("sampler.reduction_scale").micro_batches * self.sharing)

    def steps(self) -> Iterator[list[list[int]]]:
        """For each step left in the epoch, this rank's micro-batches (lists of dataset indices,
        `micro_batch_size` each; none where the ring is larger than the step's micro-batches).
        Call `record_step()` after each optimizer step."""
        batch = self._declared("sampler.steps()")
        for step in range(self.step, batch.steps_per_epoch(len(self.dataset))):
            yield batch.micro_batches_of(self._order, step, self.rank, self.num_replicas)

    def record_step(self) -> None:
        """Mark the next global step's B samples as processed (every rank, after the optimizer
        step, before the commit that holds it)."""
        batch = self._declared("sampler.record_step()")
        if self.step >= self.steps_per_epoch:
            raise ValueError(f"record_step: the epoch's {self.steps_per_epoch} steps are all recorded; "
                             "call sampler.set_epoch(epoch + 1) for the next epoch")
        self.record_indices(batch.step_samples(self._order, self.step))
        self._recorded += 1

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's dataset indices of batch `batch_idx` (of `batch_size`) in the current iteration."""
        return self.indices[batch_idx * batch_size: (batch_idx + 1) * batch_size]

    def state_dict(self) -> dict[str, Any]:
        """`{"epoch": int, "processed": bool tensor, one entry per sample}` (the live tensor:
        callers copy it, as a commit does)."""
        return {"epoch": self.epoch, "processed": self.processed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Accepts this sampler's state, or Horovod's: `processed_num` (the first samples of
        the epoch's order) or the older `processed_indices` list."""
        self.epoch = int(state["epoch"])
        if "processed" in state:
            mask = torch.as_tensor(state["processed"], dtype=torch.bool)
            if mask.shape != self.processed.shape:
                raise ValueError(
                    f"the sampler state covers {mask.numel()} samples but the data set has {len(self.processed)}; "
                    "was the data set changed since the commit?"
                )
            self.processed.copy_(mask)
        else:
            self.processed.zero_()
            if "processed_num" in state:
                order = sampling.epoch_order(len(self.dataset), self.epoch, self.seed, self.shuffle)
                self.record_indices(order[: max(0, int(state["processed_num"]))])
            else:
                self.record_indices(state.get("processed_indices", []))
        self.reset()

    def reset(self) -> None:
        """Re-deal what is left of the epoch to the current ring (after a sync or resize)."""
        if is_initialized():
            if self.by == "group":
                group = replica_group()
                self.rank, self.num_replicas = group.index, group.count
            else:
                self.rank, self.num_replicas = rank(), size()
        order = sampling.epoch_order(len(self.dataset), self.epoch, self.seed, self.shuffle)
        self.remaining_indices = sampling.remaining(order, self.processed_indices)
        self._recorded = 0
        self._order = order  # (the epoch's order, kept for the steps of this deal)
        if self.global_batch is None:
            self.indices = sampling.rank_share(self.remaining_indices, self.rank, self.num_replicas)
            return
        self._first_step = self.global_batch.steps_done(order, self.processed.tolist())
        self.indices = [i for step in range(self._first_step, self.global_batch.steps_per_epoch(len(self.dataset)))
                        for micro in self.global_batch.micro_batches_of(order, step, self.rank, self.num_replicas)
                        for i in micro]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
