"""Which commit a job of sharded replica groups goes on from, and who sends which shard (pure).

In a job of replica groups (`--group-size K`) each worker commits only its own shard of the
model (`ShardedState`): the state of the job at a commit is the K shards of that commit, one
per shard index (a worker's rank inside its group). After a failure or a resize the ring must
go on from a commit that it holds whole, every shard index at the same count, or the shards it
trains on would come from different steps.

Every rank keeps its last two commits (`latest`, `previous`): a commit's collectives pass only
once every rank saved it, so no rank of a ring is ever more than one commit ahead of another,
and the two hold a commit every shard index has. `consistent_commit` picks the newest count
held at every shard index; `transfers` says, per shard index, which rank sends that commit and
which ranks receive it: those now at that index that do not hold it there (newcomers, a partner
left over by a lost group member that joined a new group at another index) or whose bytes
differ from the sender's (never trained on: the replica guard's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

#: A count a rank does not hold (no previous commit).
NONE = -1


@dataclass(frozen=True)
class Holding:
    """What one rank holds after a reset: its shard index now, the shard index its commits were
    made at, and the counts of its two commits (`NONE` where it has no second)."""

    index: int
    committed_index: int
    latest: int
    previous: int = NONE

    def holds(self, count: int, index: int) -> bool:
        return self.committed_index == index and count != NONE and count in (self.latest, self.previous)


@dataclass(frozen=True)
class Transfer:
    """Shard index `index` of the commit goes from rank `root` to every rank of `to`."""

    index: int
    root: int
    to: tuple[int, ...]


def consistent_commit(holdings: list[Holding], group_size: int) -> int | None:
    """The newest commit count that, for every shard index 0..group_size-1, some rank holds at
    that index; None when there is none (every holder of some shard's recent commits is gone)."""
    counts = {h.latest for h in holdings} | {h.previous for h in holdings if h.previous != NONE}
    for count in sorted(counts, reverse=True):
        if all(any(h.holds(count, index) for h in holdings) for index in range(group_size)):
            return count
    return None


def transfers(holdings: list[Holding], fingerprints: list[tuple[int, ...]], count: int,
              group_size: int) -> list[Transfer]:
    """Per shard index (in order), the lowest rank holding commit `count` there sends it to the
    ranks now at that index that lack it or whose `fingerprints` (of the commit each will go on
    from) differ from the sender's. Only shard indices with receivers are listed. Raises
    ValueError when some shard index has no holder (`consistent_commit` said None)."""
    plan = []
    for index in range(group_size):
        holders = [rank for rank, h in enumerate(holdings) if h.holds(count, index)]
        if not holders:
            raise ValueError(f"no rank holds shard {index} of commit {count}")
        root = holders[0]
        to = tuple(rank for rank, h in enumerate(holdings)
                   if h.index == index and rank != root
                   and (not h.holds(count, index) or fingerprints[rank] != fingerprints[root]))
        if to:
            plan.append(Transfer(index, root, to))
    return plan
