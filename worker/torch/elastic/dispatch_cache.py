"""DTensor's kept sharding decisions, held to the rank they were made at.

DTensor keeps each sharding decision for the process under a key that names the mesh by its
shape and ranks (`DeviceMesh.__eq__`), not by this process' place in it, and a tensor an
operation makes from a kept decision carries the mesh the decision was made on. Each generation
builds its mesh again, in the same order of process groups, so for one shape and one rank the
old mesh and the new are the same in every respect, names of their groups included. For another
rank they are not: a worker whose rank changed (a survivor moved up a ring, a newcomer placed
elsewhere than it was told it likely would be) would make tensors that say they sit at its old
coordinate, in its old groups. Seen on torch 2.13 (`tests/unit/train/test_dispatch_warmup.py`):
after a mesh at rank 0, an elementwise result at rank 3 said it sat at rank 0's coordinate, its
shard at row 0 rather than row 3, where a DCP checkpoint would write it; a reduction over such a
tensor would run in another rank's group.

So every mesh a worker builds, its generations' and a newcomer's warm-up (`dispatch_warmup`), is
noted here with its rank, and when the decisions of its shape were made at another rank they are
all dropped (torch's own way to clear them): that worker's next steps work them out again.
"""

from __future__ import annotations

#: mesh shape -> the rank this process had when DTensor's kept decisions for that shape were made
_made_at: dict[tuple[int, ...], int] = {}


def entering(shape: tuple[int, ...], rank: int) -> bool:
    """A mesh of `shape` is built with this process at `rank`. Drops DTensor's kept decisions when
    those of this shape were made at another rank; True when it did."""
    made = _made_at.get(shape)
    dropped = made is not None and made != rank
    if dropped:
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _clear_sharding_prop_cache()
        _made_at.clear()
    _made_at[shape] = rank
    return dropped
