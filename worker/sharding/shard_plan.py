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


@dataclass(frozen=True)
class SyncProof:
    """What one rank says, in the sync's second allgather, of the commit it goes on from and of
    what it will do with it: `plain` is the digest of the commit's plain entries (attributes,
    samplers), `loads` that it loads the commit into every object it trains (it rebuilt them on
    the new mesh, or went back a commit), `covers` that the commit holds every object `build`
    made, `callbacks` that it has reset callbacks of the script's to run."""

    plain: int
    loads: bool
    covers: bool
    callbacks: bool


def equal_by_sync(proofs: list[SyncProof], plan: list[Transfer], resumed: bool) -> bool:
    """Whether the sync itself proves every rank's live state equal to its replicas' (the replica
    guard's question), so that the guard's own collective after it has nothing left to learn.

    It does when: every rank trains on a commit loaded whole (a receiver loads what it received);
    after `transfers` every rank at a shard index holds bytes equal to its sender's (those whose
    fingerprint differed receive, and a receiver checks what arrived against the sender's
    digest); the plain entries are equal across the ring; and nothing runs between the load and
    training that could make the ranks differ: no script's reset callback (those are what the
    guard is for), nothing resumed from disk. Pure, and the same answer on every rank."""
    if resumed or not proofs:
        return False
    receivers = {rank for transfer in plan for rank in transfer.to}
    holders = [proof for rank, proof in enumerate(proofs) if rank not in receivers]
    return (all(proof.loads for proof in holders) and all(proof.covers for proof in holders)
            and not any(proof.callbacks for proof in proofs) and len({proof.plain for proof in holders}) == 1)
