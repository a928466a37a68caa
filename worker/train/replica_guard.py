"""The replica guard: after every sync, prove that every rank trains on rank 0's state.

The sync moves commits; what a rank trains on is its *live* state, after loading and after the
reset callbacks. A bug anywhere on that path (a handler that loads part of an entry, a callback
that depends on the rank, a plain attribute changed outside the commit) would let replicas
drift apart silently: nothing crashes and the model is wrong. So right after each sync every
rank hashes each entry of its live state (`checkpoint.digest`, every byte) and the ranks compare
the digests in one small allgather. The comparison is pure (`differences`); the I/O is one
collective of `SLOTS` int64 per rank.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ringmaster.checkpoint.digest import entry_digests, tree_digest
from ringmaster.worker.train.collectives import Communicator

#: int64 numbers each rank sends: a digest of the entry names, then one digest per entry (the
#: last slot folds together the entries past the first SLOTS - 2).
SLOTS = 64


def _split(names: list[str]) -> tuple[list[str], list[str]]:
    """Sorted entry names: those with a slot of their own, and those folded into the last."""
    ordered = sorted(names)
    return ordered[: SLOTS - 2], ordered[SLOTS - 2:]


def slot_names(names: list[str]) -> list[str]:
    """What each digest slot after the first stands for."""
    head, rest = _split(names)
    return head + ([", ".join(rest)] if rest else [])


def pack(digests: Mapping[str, int]) -> list[int]:
    """Pure: the fixed-size vector a rank sends for its per-entry digests."""
    head, rest = _split(list(digests))
    vector = [tree_digest(head + rest)] + [digests[name] for name in head]
    if rest:
        vector.append(tree_digest([digests[name] for name in rest]))
    return vector + [0] * (SLOTS - len(vector))


def differences(vectors: list[list[int]], names: list[str], root: int = 0) -> dict[int, tuple[str, ...]]:
    """Pure: for each rank whose vector differs from the root's, the entries that differ."""
    reference = vectors[root]
    labels = slot_names(names)
    found: dict[int, tuple[str, ...]] = {}
    for rank, vector in enumerate(vectors):
        if rank == root or vector == reference:
            continue
        if vector[0] != reference[0]:
            found[rank] = ("the set of state entries",)
        else:
            found[rank] = tuple(label for i, label in enumerate(labels) if vector[i + 1] != reference[i + 1])
    return found


def compare_live_state(entries: Mapping[str, Any], comm: Communicator, root: int = 0) -> dict[int, tuple[str, ...]]:
    """Every rank: digest `entries` (the live state) and compare with the root's. Returns the
    same verdict on every rank: which ranks differ, and in which entries."""
    if comm.size == 1:
        return {}
    digests = entry_digests(entries)
    gathered = comm.allgather(torch.tensor(pack(digests), dtype=torch.int64))
    return differences([[int(x) for x in g.tolist()] for g in gathered], list(digests), root)


def compare_live_state_in_groups(plain: Mapping[str, Any], sharded: Mapping[str, Any], comm: Communicator,
                                  group_size: int) -> dict[int, tuple[str, ...]]:
    """Replica groups (rank r holds shard index r % group_size): `plain` entries are compared
    with rank 0's, `sharded` ones with those of the first rank of the same shard index. One
    allgather of both digest vectors; every rank sees every vector, so every rank reaches the
    same verdict without a second collective (and without a ring per shard index)."""
    if comm.size == 1:
        return {}
    plain_digests, sharded_digests = entry_digests(plain), entry_digests(sharded)
    gathered = comm.allgather(torch.tensor(pack(plain_digests) + pack(sharded_digests), dtype=torch.int64))
    vectors = [[int(x) for x in g.tolist()] for g in gathered]
    return group_differences(vectors, list(plain_digests), list(sharded_digests), group_size)


def group_differences(vectors: list[list[int]], plain_names: list[str], sharded_names: list[str],
                      group_size: int) -> dict[int, tuple[str, ...]]:
    """Pure: each rank's vector is its plain entries' `pack` then its shards'; the ranks whose
    plain entries differ from rank 0's, or whose shards differ from the first rank's of their
    shard index, with the entries that differ."""
    found = {rank: set(names) for rank, names in differences([v[:SLOTS] for v in vectors], plain_names).items()}
    for index in range(group_size):
        ranks = list(range(index, len(vectors), group_size))
        for position, names in differences([vectors[r][SLOTS:] for r in ranks], sharded_names).items():
            found.setdefault(ranks[position], set()).update(names)
    return {rank: tuple(sorted(names)) for rank, names in sorted(found.items())}


def describe(found: Mapping[int, tuple[str, ...]]) -> str:
    """'rank 2: optimizer; rank 3: model, optimizer' (for log lines and errors)."""
    return "; ".join(f"rank {rank}: {', '.join(names)}" for rank, names in sorted(found.items()))
