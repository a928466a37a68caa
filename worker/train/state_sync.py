"""Give every rank rank 0's committed state, moving only what differs.

After a reset every rank holds a commit: survivors of a failure all rolled back to the same
one, newcomers hold their freshly built model. Each rank sends a three-number fingerprint of its
commit (objects and layout, layout, bytes) in one small allgather; ranks equal to rank 0 receive
nothing. The same allgather carries whether the rank went through a reset, so every rank learns
in it whether reset callbacks are due (a newcomer has not been through one itself). If any differ, rank 0's skeleton (objects and tensor layout) goes out as one object
broadcast, and its tensors as one flat buffer per dtype: by broadcast when every other rank
needs them, by point-to-point sends to just those ranks otherwise. A recovery after a failure
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

    @property
    def nothing(self) -> bool:
        return not self.skeleton_to


def plan(fingerprints: list[tuple[int, ...]], root: int) -> SyncPlan:
    """Pure: ranks whose (objects+layout, layout, bytes) fingerprint differs from the root's;
    a fourth number, when present, is each rank's reset flag."""
    everything, layout, data = fingerprints[root][:3]
    skeleton_to = tuple(r for r, f in enumerate(fingerprints) if r != root and f[0] != everything)
    tensors_to = tuple(r for r, f in enumerate(fingerprints) if r != root and (f[1] != layout or f[2] != data))
    after_reset = any(len(f) > 3 and f[3] for f in fingerprints)
    return SyncPlan(tuple(sorted(set(skeleton_to) | set(tensors_to))), tensors_to, after_reset)


def fingerprint(snapshot: HostSnapshot) -> tuple[int, int, int]:
    return (skeleton_digest(snapshot.skeleton), skeleton_digest(snapshot.layout), snapshot.data_digest())


def sync_snapshot(
    snapshot: HostSnapshot, comm: Communicator, broadcast_object: Callable[[Any, int], Any], root: int = 0,
    after_reset: bool = False,
) -> SyncPlan:
    """Make this rank's snapshot equal to `root`'s. Returns the plan; this rank's snapshot
    changed when its rank is in `plan.skeleton_to`. `after_reset` is this rank's reset flag;
    the plan's is true when any rank's was."""
    if comm.size == 1:
        return SyncPlan((), (), after_reset)
    mine = torch.tensor((*fingerprint(snapshot), int(after_reset)), dtype=torch.int64)
    gathered = comm.allgather(mine)
    the_plan = plan([tuple(int(x) for x in g.tolist()) for g in gathered], root)  # type: ignore[misc]
    if the_plan.nothing:
        return the_plan
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
