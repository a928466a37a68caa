"""Give every rank the newest committed state in the ring, moving only what differs.

After a reset every rank holds a commit: survivors of a failure rolled back to their last one,
newcomers hold their freshly built model (or a commit of their own from a ring they left long
ago). Each rank sends a three-number fingerprint of its commit (objects and layout, layout,
bytes) and its commit count in one small allgather. The root is the rank holding the most
commits (the lowest such rank: rank 0 whenever it holds the newest, as it does in every ring
the rendezvous formed from survivors), so a rank that holds an old commit never hands it to the
others, whatever rank it got: a worker cut off from the job for a while that comes back as a
newcomer, or survivors of a failure that hit between two ranks' commits of the same step. Ranks
equal to the root receive nothing. The same allgather carries whether the rank went through a
reset, so every rank learns in it whether reset callbacks are due (a newcomer has not been
through one itself). If any differ, the root's skeleton (objects and tensor layout) goes out as
one object broadcast, and its tensors as one flat buffer per dtype: by broadcast when every
other rank needs them, by point-to-point sends to just those ranks otherwise. A recovery after a failure
thus moves no state at all, and a newcomer costs the survivors nothing but the fingerprint.
A receiver's commit changes only once all of the root's bytes arrived (into buffers of their
own): a root that dies in the middle leaves every receiver its own last commit, whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ringmaster.checkpoint.memory import HostSnapshot
from ringmaster.checkpoint.tree import skeleton_digest
from ringmaster.worker.train.collectives import Communicator


@dataclass(frozen=True)
class SyncPlan:
    """Who needs what from the root, decided identically on every rank from the fingerprints."""

    skeleton_to: tuple[int, ...]
    tensors_to: tuple[int, ...]
    #: Some rank of the ring went through a reset (or resumed from a checkpoint): the state
    #: comes from another ring, so every rank runs the reset callbacks.
    after_reset: bool = False
    #: The rank whose commit every rank holds now.
    root: int = 0

    @property
    def nothing(self) -> bool:
        return not self.skeleton_to


def newest(fingerprints: list[tuple[int, ...]]) -> int:
    """Pure: the lowest rank holding the most commits (the fifth number; rank 0 without one)."""
    counts = [f[4] if len(f) > 4 else 0 for f in fingerprints]
    return counts.index(max(counts))


def plan(fingerprints: list[tuple[int, ...]], root: int | None = None) -> SyncPlan:
    """Pure: ranks whose (objects+layout, layout, bytes) fingerprint differs from the root's;
    a fourth number, when present, is each rank's reset flag, a fifth its commit count (the
    root, when not given, is the `newest`)."""
    if root is None:
        root = newest(fingerprints)
    everything, layout, data = fingerprints[root][:3]
    skeleton_to = tuple(r for r, f in enumerate(fingerprints) if r != root and f[0] != everything)
    tensors_to = tuple(r for r, f in enumerate(fingerprints) if r != root and (f[1] != layout or f[2] != data))
    after_reset = any(len(f) > 3 and f[3] for f in fingerprints)
    return SyncPlan(tuple(sorted(set(skeleton_to) | set(tensors_to))), tensors_to, after_reset, root)


def fingerprint(snapshot: HostSnapshot) -> tuple[int, int, int]:
    return (skeleton_digest(snapshot.skeleton), skeleton_digest(snapshot.layout), snapshot.data_digest())


def sync_snapshot(
    snapshot: HostSnapshot, comm: Communicator, broadcast_object: Callable[[Any, int], Any], commits: int = 0,
    after_reset: bool = False,
) -> SyncPlan:
    """Make this rank's snapshot equal to that of the rank holding the most commits (`commits`
    is this rank's count). Returns the plan; this rank's snapshot changed when its rank is in
    `plan.skeleton_to`. `after_reset` is this rank's reset flag; the plan's is true when any
    rank's was."""
    if comm.size == 1:
        return SyncPlan((), (), after_reset)
    mine = torch.tensor((*fingerprint(snapshot), int(after_reset), commits), dtype=torch.int64)
    gathered = comm.allgather(mine)
    the_plan = plan([tuple(int(x) for x in g.tolist()) for g in gathered])
    if the_plan.nothing:
        return the_plan
    root = the_plan.root
    skeleton = broadcast_object(snapshot.skeleton if comm.rank == root else None, root)
    receiving = comm.rank in the_plan.tensors_to
    if comm.rank in the_plan.skeleton_to and not receiving:
        snapshot.skeleton = skeleton  # same tensors, new objects
    if not the_plan.tensors_to or (comm.rank != root and not receiving):
        return the_plan
    # A receiver takes the root's commit only once every buffer arrived: a root that dies
    # halfway leaves this rank's own commit whole, not half of its bytes under its objects.
    target = snapshot.incoming(skeleton) if receiving else snapshot
    everyone = len(the_plan.tensors_to) == comm.size - 1
    for buffer in target.buffers:
        if everyone:
            comm.broadcast_(buffer, root)
        elif comm.rank == root:
            for dst in the_plan.tensors_to:
                comm.send(buffer, dst)
        else:
            comm.recv_(buffer, root)
    if receiving:
        snapshot.replace(target)
    return the_plan
