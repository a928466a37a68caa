"""Which samples each rank reads when a job declares its global batch: pure functions behind
`ElasticSampler(global_batch_size=B, micro_batch_size=m)`.

The samples follow the step, not the rank. Global step s of an epoch is the B samples
`order[s*B:(s+1)*B]` of the epoch's fixed order (seed, epoch), cut into K = B/m micro-batches of
m consecutive samples. A ring of W ranks (or W replica groups) shares out the micro-batch
numbers 0..K-1 in contiguous blocks: rank r takes floor(r*K/W) .. floor((r+1)*K/W)-1, so counts
differ by at most one (3, 3, 2 of 8 over three ranks) and every micro-batch is taken once. Each
rank sums the gradients of its micro-batches (each the mean over its m samples), the ring sums
those, and the reduction divides by K: the update is the mean over the same B samples at any
world size, up to the order in which floating-point sums are taken.

An epoch has N // B steps; the last N mod B samples of its order are not used (a step is
always a whole global batch, as `drop_last=True` does). A world larger than K leaves ranks
without a micro-batch: they contribute zero gradients and still take part in the reduction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class GlobalBatch:
    """A declared global batch: `size` samples per optimizer step, in micro-batches of `micro`."""

    size: int
    micro: int

    def __post_init__(self) -> None:
        for name, value in (("global_batch_size", self.size), ("micro_batch_size", self.micro)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: give a whole number of samples, 1 or more")
        if self.size % self.micro:
            raise ValueError(f"global_batch_size={self.size} is not a whole number of micro-batches of "
                             f"micro_batch_size={self.micro}: give a global batch that is a multiple of the "
                             f"micro-batch (e.g. {self.size - self.size % self.micro or self.micro})")

    @property
    def micro_batches(self) -> int:
        """K: micro-batches per global step, summed across the ring."""
        return self.size // self.micro

    def steps_per_epoch(self, num_samples: int) -> int:
        """Whole global steps in an epoch of `num_samples` (the remainder is not used)."""
        return num_samples // self.size

    def micro_numbers(self, rank: int, size: int) -> range:
        """The micro-batch numbers (0..K-1) rank `rank` of `size` takes at every step."""
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a ring of {size}")
        k = self.micro_batches
        return range(rank * k // size, (rank + 1) * k // size)

    def step_samples(self, order: Sequence[int], step: int) -> list[int]:
        """The B samples of global step `step` (0-based within the epoch)."""
        return list(order[step * self.size:(step + 1) * self.size])

    def micro_batches_of(self, order: Sequence[int], step: int, rank: int, size: int) -> list[list[int]]:
        """Rank `rank`'s micro-batches of step `step`: lists of dataset indices, in order."""
        first = step * self.size
        return [list(order[first + j * self.micro:first + (j + 1) * self.micro])
                for j in self.micro_numbers(rank, size)]

    def steps_done(self, order: Sequence[int], processed: Sequence[bool]) -> int:
        """How many whole steps of the epoch `processed` (a mask over the data set) holds: the
        length of the prefix of whole global batches of `order` that are processed. Raises
        where the mask is not such a prefix (a commit made without the global batch, or of
        another size), naming what to do."""
        done = sum(1 for i in order if processed[i])
        steps, rest = divmod(done, self.size)
        prefix = order[:steps * self.size]
        if rest or not all(processed[i] for i in prefix):
            raise ValueError(f"the sampler's committed progress ({done} samples of the epoch) is not a whole number of "
                             f"global batches of {self.size} in the epoch's order: it was committed without "
                             "global_batch_size or with another one; keep the global batch of the run that committed "
                             "it, or start the epoch afresh (sampler.set_epoch)")
        return steps
