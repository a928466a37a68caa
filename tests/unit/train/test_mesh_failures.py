"""What `hvd.elastic.run` makes of torch.distributed's own errors (the generation's mesh, FSDP2's
collectives): a real Gloo failure inside torch.distributed while the generation ended is a
rollback, the script's own error is raised; a real Gloo collective its peer left is cut short
when the generation ends (its connections shut down); and the replica group's numbers."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.torch import elastic
from ringmaster.torch.elastic import groups
from ringmaster.worker.sharding import mesh_sockets
from ringmaster.worker.train.errors import HorovodInternalError
from ringmaster.worker.train.link import RendezvousLink
from ringmaster.worker.train.say import Kind

GENERATION = 4
_PARKED: list = []  # rings left with a collective running, kept for the process' life


def _ring_of_two(timeout_s: float = 60) -> tuple[dict[int, Any], dict[str, int]]:
    """Two ranks of a real Gloo group in this process, and the sockets their making opened."""
    store = dist.HashStore()
    before = mesh_sockets.open_sockets()
    pgs: dict[int, Any] = {}
    threads = [threading.Thread(target=lambda r=r: pgs.__setitem__(
        r, dist.ProcessGroupGloo(dist.PrefixStore("ring/", store), r, 2, timedelta(seconds=timeout_s))))
        for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return pgs, mesh_sockets.opened_since(before)


def _gloo_error_after_the_peer_left() -> RuntimeError:
    """A real error of torch.distributed's `all_reduce`: rank 0's peer ends (its thread drops
    its only reference to its ring, which closes its connections, as a killed process' do)."""
    pgs, _ = _ring_of_two()
    ring = pgs.pop(0)
    pgs.clear()  # rank 1 is gone
    with pytest.raises(RuntimeError) as caught:
        dist.all_reduce(torch.ones(4), group=ring)
    return caught.value


def _context(over: str | None) -> Any:
    """What `_rollback_reason` reads of a worker's context: its link and its assignment."""
    link = RendezvousLink("127.0.0.1:1", "h/0", "h")
    link._on_event(pb.WorkerEvent(assignment=pb.Assignment(generation=GENERATION, rank=0, size=2)))
    if over:
        link._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=GENERATION, reason=over)))
    return SimpleNamespace(link=link, assignment=SimpleNamespace(generation=GENERATION))


def test_a_gloo_error_inside_torch_distributed_is_a_rollback_once_the_generation_is_over(monkeypatch) -> None:
    error = _gloo_error_after_the_peer_left()
    assert "Connection closed by peer" in str(error) or "Connection reset" in str(error)
    reason = elastic._rollback_reason(error, _context("worker h/1 failed"))
    assert reason is not None and reason.startswith("RuntimeError on the generation's mesh: ")
    assert "(generation over: worker h/1 failed)" in reason and "\n" not in reason
    # the generation still stands after the wait: the script's own error, raised
    monkeypatch.setattr(elastic, "MESH_FAILURE_WAIT_S", 0.2)
    assert elastic._rollback_reason(error, _context(None)) is None


def test_the_scripts_own_runtime_error_is_never_a_rollback() -> None:
    assert elastic._rollback_reason(RuntimeError("shape mismatch in my model"), _context("worker h/1 failed")) is None
    try:
        torch.ones(2) @ torch.ones(3)
    except RuntimeError as own:
        assert elastic._rollback_reason(own, _context("worker h/1 failed")) is None


def test_the_generation_over_is_waited_for_and_wakes_the_wait_at_once() -> None:
    context = _context(None)
    threading.Timer(0.1, lambda: context.link._on_event(pb.WorkerEvent(
        generation_over=pb.GenerationOver(generation=GENERATION, reason="h/1 lost")))).start()
    assert context.link.wait_generation_over(GENERATION, 20) == "h/1 lost"
    assert context.link.wait_generation_over(GENERATION + 1, 0.05) is None


def test_a_replica_group_is_consecutive_ranks_and_its_peers_hold_the_same_shard(monkeypatch) -> None:
    monkeypatch.setattr(groups, "rank", lambda: 5)
    monkeypatch.setattr(groups, "size", lambda: 6)
    monkeypatch.setenv("RINGMASTER_GROUP_SIZE", "2")
    group = groups.replica_group()
    assert group == groups.ReplicaGroup(index=2, count=3, rank=1, size=2)
    assert group.ranks == [4, 5] and group.peers() == [1, 3, 5]
    monkeypatch.setenv("RINGMASTER_GROUP_SIZE", "4")
    with pytest.raises(RuntimeError, match="6 workers, not a whole number of groups of 4"):
        groups.replica_group()
    for bad in ("0", "x", "99999"):
        with pytest.raises(ValueError, match="RINGMASTER_GROUP_SIZE"):
            groups.group_size({"RINGMASTER_GROUP_SIZE": bad})
    assert groups.group_size({}) == 1


def test_a_collective_its_peer_left_fails_at_once_when_the_generation_ends_not_at_its_timeout() -> None:
    pgs, sockets = _ring_of_two()
    assert sockets, "the group's connections were seen being opened"
    failed: list[BaseException] = []

    def alone() -> None:  # rank 0 in an allreduce that rank 1 (alive, elsewhere) never joins
        try:
            pgs[0].allreduce([torch.ones(4)]).wait()
        except RuntimeError as exc:
            failed.append(exc)

    waiting = threading.Thread(target=alone)
    waiting.start()
    context = _context(None)
    released = threading.Event()
    mesh_sockets.cut_when_over(context.link, GENERATION, sockets, released)
    waiting.join(0.5)
    assert waiting.is_alive(), "the allreduce waits while the generation stands"
    started = time.monotonic()
    context.link._on_event(pb.WorkerEvent(generation_over=pb.GenerationOver(generation=GENERATION, reason="h/1 lost")))
    waiting.join(20)
    assert not waiting.is_alive() and failed, "the generation's end cut the connections"
    assert time.monotonic() - started < 10, "well before the group's 60 s timeout"
    assert "closed by peer" in str(failed[0]) or "reset by peer" in str(failed[0])
    # this process lives on (Gloo's listeners were left alone) and a cut socket is not cut twice
    assert mesh_sockets.cut(sockets) == 0


def test_only_sockets_still_open_and_the_same_are_cut() -> None:
    pgs, sockets = _ring_of_two()
    assert mesh_sockets.cut({"socket:[1]": max(sockets.values())}) == 0  # the number reused by another socket
    assert mesh_sockets.cut({inode: 10_000 for inode in sockets}) == 0  # closed
    assert mesh_sockets.cut(sockets) >= 1


def test_a_guarded_collective_its_peer_never_joins_is_given_up_when_the_generation_ends() -> None:
    """FSDP2's collectives as `ShardedState` gives them (`guarded_comms`): a Gloo all-gather whose
    peer never posts its part (Gloo itself may never fail it: seen, a survivor's send waited out
    the 60 s timeout) raises as soon as the generation is over, and is kept as abandoned."""
    from ringmaster.worker.sharding import guarded_comms
    from ringmaster.worker.train.errors import HorovodInternalError

    pgs, _ = _ring_of_two(timeout_s=2)  # (parked below: its collective ends in Gloo 2 s later)
    work = pgs[0]._allgather_base(torch.zeros(8), torch.ones(4))  # rank 1 never joins
    said: list[str | None] = [None]
    raised: list[BaseException] = []

    def waiting() -> None:
        try:
            guarded_comms.wait_guarded(work, lambda: said[0], "FSDP2's all-gather")
        except HorovodInternalError as exc:
            raised.append(exc)

    thread = threading.Thread(target=waiting)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive(), "it waits while the generation stands"
    started = time.monotonic()
    said[0] = "h/1 lost"
    thread.join(10)
    assert not thread.is_alive() and raised and time.monotonic() - started < 2
    assert "generation is over (h/1 lost)" in str(raised[0])
    assert work in guarded_comms.pending_abandoned()
    guarded_comms.abandoned.clear()
    _PARKED.append(pgs)  # (a Gloo group's destructor waits for its work: not at this test's end, but Gloo's timeout)


def test_a_worker_told_to_leave_inside_a_collective_leaves_without_a_rollback_a_peers_failure_rolls_back(
        monkeypatch) -> None:
    """`hvd.elastic.run` with its context stood in for: the training function fails as a
    collective cut at the generation's end does. A member of a leaving host is retired as soon as
    one member reported the host update's commit (`HostsUpdated.placed`), and may still be inside
    that commit's agreement: its collective is cut, and it leaves (seen in CI as a scale-down's
    "rolled back to commit 63"). Not a rollback; the same failure without the word to leave is."""
    from ringmaster.worker.train.state_sync import SyncPlan

    def attempt(leaving: bool) -> tuple[list, object]:
        said: list = []
        monkeypatch.setattr(elastic, "say", lambda kind, *args, **kwargs: said.append(kind))
        monkeypatch.setattr(elastic, "init", lambda: None)
        monkeypatch.setattr(elastic, "release_mesh", lambda: None)

        def rejoin(failure: str) -> None:
            if leaving:
                raise SystemExit(0)  # (what the context's guard does for a retired worker: leave(0))

        context = SimpleNamespace(link=SimpleNamespace(leaving=lambda: leaving),
                                  assignment=SimpleNamespace(generation=2), enter_elastic=lambda: None,
                                  rejoin=rejoin, last_join_s=(0.0, 0.0), topology=lambda: (0, 1, 0, 1, 0, 1),
                                  report_done=lambda warning: None)
        monkeypatch.setattr(elastic, "current_context", lambda: context)
        state = SimpleNamespace(save=lambda: None, sync_committed=lambda after_reset: SyncPlan((), (), False, 0),
                                reset=lambda: None, on_reset=lambda: None, verify_replicas=lambda: False,
                                restore=lambda: None, leave_generation=lambda: None, commit_count=63,
                                finish=lambda: "")
        calls = []

        @elastic.run
        def train(state) -> str:
            calls.append(1)
            if len(calls) == 1:
                raise HorovodInternalError("allgather aborted: generation 2 is over (the worker is leaving the job)")
            return "trained"

        try:
            return said, train(state)
        except SystemExit as exc:
            return said, exc

    said, outcome = attempt(leaving=True)
    assert isinstance(outcome, SystemExit) and Kind.ROLLED_BACK not in said
    said, outcome = attempt(leaving=False)
    assert outcome == "trained" and Kind.ROLLED_BACK in said
