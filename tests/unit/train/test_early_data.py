"""An operation's data sent during its round (`speculation`, `early_data`): the pure matching of
every transfer of a round, whatever the ranks announced, and on real Gloo rings of threads the
round alone doing an allgather, alltoall or reducescatter, its guess corrected, and ranks that
issued different operations refused on every rank with the ring usable after."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import pytest
import torch
from gloo_rings import count_collectives, on_ranks, run

from ringmaster.torch import operations as ops
from ringmaster.worker.train import negotiation, speculation
from ringmaster.worker.train.collectives import Communicator
from ringmaster.worker.train.errors import CollectiveMismatchError
from ringmaster.worker.train.op_queue import INLINE_BYTES_ENV
from ringmaster.worker.train.speculation import NONE, Announcement

#: float32 elements past the negotiation's inline area: these operations are never carried inline.
BIG = negotiation.INLINE_AREA_BYTES // 4 + 16


def _transfers(n: int, round_number: int, announced: list[Announcement]) -> tuple[Counter, Counter, list[list[bool]]]:
    """Every message and every receive of a round, as each rank makes them from the announcements:
    (messages, receives) by (source, destination, tag, bytes or capacity), and each rank's `landed`."""
    messages: Counter = Counter()
    receives: Counter = Counter()
    landed = []
    for rank, mine in enumerate(announced):
        for peer in range(n):
            if mine.sent[peer] != NONE:
                messages[(rank, peer, speculation.data_tag(round_number, mine.sent[peer]), mine.sent[peer])] += 1
            if mine.expected[peer] != NONE:
                receives[(peer, rank, speculation.data_tag(round_number, mine.expected[peer]),
                          mine.expected[peer])] += 1
        matching = speculation.match(rank, round_number, announced)
        for peer, tag in matching.empty_to:
            messages[(rank, peer, tag, 0)] += 1
        for peer, tag, nbytes in matching.absorb_from:
            receives[(peer, rank, tag, nbytes)] += 1
        landed.append(matching.landed)
    return messages, receives, landed


def test_every_early_transfer_meets_exactly_one_receive_of_its_size_whatever_the_ranks_announced() -> None:
    """Each message meets exactly one receive on its tag (between the same two ranks) that is
    at least its size, and no receive is left without one: nothing stays pending on the ring,
    and no bytes land in a buffer smaller than they are. Two to four ranks, each sending early
    or not, with sizes that agree or not; seeded, 3,000 rounds."""
    rng = random.Random(52)
    sizes = [NONE, 0, 8, 16, 24]
    for _ in range(3000):
        n = rng.choice([2, 3, 4])
        round_number = rng.randrange(1, 600)
        announced = []
        for rank in range(n):
            sends = rng.random() < 0.7
            sent = [NONE if peer == rank or not sends else rng.choice(sizes[1:]) for peer in range(n)]
            expected = [NONE if peer == rank or not sends else rng.choice(sizes) for peer in range(n)]
            announced.append(Announcement(sent, expected))
        messages, receives, landed = _transfers(n, round_number, announced)
        # by (source, destination, tag): one message, one receive; the receive holds the message
        by_tag_messages = Counter({key[:3]: count for key, count in messages.items()})
        by_tag_receives = Counter({key[:3]: count for key, count in receives.items()})
        assert set(by_tag_messages) == set(by_tag_receives), (announced, messages, receives)
        assert all(c == 1 for c in (*by_tag_messages.values(), *by_tag_receives.values())), (announced, messages)
        capacity = {key[:3]: key[3] for key in receives}
        assert all(key[3] <= capacity[key[:3]] for key in messages), (announced, messages)
        for rank in range(n):
            for peer in range(n):
                theirs = announced[peer].sent[rank]
                assert landed[rank][peer] == (peer != rank and theirs != NONE
                                              and theirs == announced[rank].expected[peer])


def test_a_round_message_announcing_impossible_early_data_is_refused_naming_the_rank() -> None:
    good = Announcement([NONE, 8, 8], [NONE, 8, 0])
    assert Announcement.from_words(good.words(), 3, 0) == good
    for sent, expected, why in (([NONE, 8, speculation.MAX_BYTES], [NONE, 8, 8], "bytes early"),
                                ([NONE, -5, 8], [NONE, 8, 8], "bytes early"),
                                ([NONE, 8, NONE], [NONE, 8, 8], "every peer or to none"),
                                ([4, 8, 8], [NONE, 8, 8], "never to itself")):
        with pytest.raises(ValueError, match=why) as caught:
            Announcement.from_words(Announcement(sent, expected).words(), 3, 0)
        assert "rank 0" in str(caught.value)
    with pytest.raises(ValueError, match="0 to"):
        speculation.data_tag(1, speculation.MAX_BYTES)


def _three_kinds(comm: Communicator, rows: int) -> list[Any]:
    r, n = comm.rank, comm.size
    gathered = run(comm, ops.allgather(torch.full((rows, BIG // 64), float(r)), None))
    swapped, received = run(comm, ops.alltoall(torch.arange(n * BIG, dtype=torch.float32) + 1000 * r, None, n, None))
    scattered = run(comm, ops.reducescatter(torch.arange(float(n * BIG)) * (r + 1), ops.Average, 1.0, 2.0, None))
    return [gathered, swapped, received, scattered]


def test_an_allgather_alltoall_or_reducescatter_is_its_round_alone_with_the_collectives_results(monkeypatch) -> None:
    """Each is one collective (the round's allgather; the data moves point to point beside it)
    where it used to be two, and gives what the collective gives, on 2 and 3 ranks."""
    for n in (2, 3):
        started = count_collectives(monkeypatch)
        monkeypatch.setenv(INLINE_BYTES_ENV, "0")
        early = on_ranks(n, lambda comm: _three_kinds(comm, 64))
        assert started == ["allgather"] * (3 * n), started
        monkeypatch.setenv("RINGMASTER_EARLY_DATA", "0")
        started.clear()
        late = on_ranks(n, lambda comm: _three_kinds(comm, 64))
        assert len(started) >= 2 * 3 * n, started
        monkeypatch.delenv("RINGMASTER_EARLY_DATA")
        for ours, theirs in zip(early, late):
            assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(ours, theirs))
        rank0 = early[0]
        assert rank0[0].shape == (64 * n, BIG // 64) and rank0[0][-1, 0].item() == n - 1
        assert rank0[2].tolist() == [BIG] * n and rank0[3][1].item() == 2.0 * sum(range(1, n + 1)) / n


def test_a_wrong_guess_is_corrected_in_the_same_round(monkeypatch) -> None:
    """Ranks gathering different row counts, or sending another number of rows than they
    receive, guessed wrong: the bytes that came are taken as they are, still without a collective
    of their own."""
    started = count_collectives(monkeypatch)

    def work(comm: Communicator) -> list[Any]:
        r = comm.rank
        gathered = run(comm, ops.allgather(torch.full((r + 1, BIG), float(r)), None))
        splits = [(2 * j + r) % 3 + 1 for j in range(3)]
        rows = torch.tensor([[r, j] for j in range(3) for _ in range(splits[j])], dtype=torch.int64).repeat(1, BIG // 2)
        return [gathered, *run(comm, ops.alltoall(rows, splits, 3, None))]

    results = on_ranks(3, work)
    assert started == ["allgather"] * 6, started
    for me, (gathered, swapped, received) in enumerate(results):
        assert [int(v) for v in gathered[:, 0].tolist()] == [0, 1, 1, 2, 2, 2]
        assert received.tolist() == [(2 * me + r) % 3 + 1 for r in range(3)]
        assert swapped[:, :2].tolist() == [[r, me] for r in range(3) for _ in range((2 * me + r) % 3 + 1)]
        assert swapped.shape[1] == BIG


@pytest.mark.parametrize("pair", ["allgather-alltoall", "allgather-reducescatter-same-bytes", "allgather-allreduce"])
def test_ranks_that_issue_different_operations_with_early_data_are_refused_on_every_rank_and_the_ring_goes_on(
        monkeypatch, pair: str) -> None:
    """Rank 1 issues another operation than rank 0 (its bytes another size, the same size, or none
    sent early): both get the mismatch, and the next operation, early too, gives the right result."""
    monkeypatch.setenv(INLINE_BYTES_ENV, "0")

    def work(comm: Communicator) -> tuple[str, list[float]]:
        first = ops.allgather(torch.ones(BIG), None)
        other = {"allgather-alltoall": lambda: ops.alltoall(torch.ones(4 * BIG), None, 2, None),
                 "allgather-reducescatter-same-bytes": lambda: ops.reducescatter(torch.ones(2 * BIG), ops.Sum, 1.0,
                                                                                 1.0, None),
                 "allgather-allreduce": lambda: ops.allreduce(torch.ones(BIG), torch.empty(BIG), ops.Sum, 1.0, 1.0,
                                                              None)}[pair]()
        with pytest.raises(CollectiveMismatchError) as caught:
            run(comm, first if comm.rank == 0 else other)
        after = run(comm, ops.allgather(torch.full((BIG,), float(comm.rank)), None))
        return str(caught.value), [after[0].item(), after[-1].item(), float(after.numel())]

    for message, after in on_ranks(2, work):
        assert "ranks must issue the same collectives" in message
        assert after == [0.0, 1.0, 2.0 * BIG]


def test_every_transfer_of_a_ring_sized_past_the_limit_goes_after_its_round(monkeypatch) -> None:
    """Rings of more than `speculation.MAX_RANKS` send nothing early (each rank would send to each
    peer): their operations run as collectives, with the same results."""
    monkeypatch.setattr(speculation, "MAX_RANKS", 2)
    monkeypatch.setenv(INLINE_BYTES_ENV, "0")
    started = count_collectives(monkeypatch)
    results = on_ranks(3, lambda comm: run(comm, ops.allgather(torch.full((BIG,), float(comm.rank)), None)))
    assert len(started) == 2 * 3, started  # per rank: the round and the allgather
    assert all(r.tolist() == [0.0] * BIG + [1.0] * BIG + [2.0] * BIG for r in results)


def test_early_data_needs_no_tag_outside_its_own_range() -> None:
    tags = [speculation.data_tag(r, b) for r, b in itertools.product((0, 1, 255, 256, 10**6),
                                                                     (0, 1, speculation.MAX_BYTES - 1))]
    assert min(tags) >= speculation.TAG_BASE and max(tags) < 2**31
    assert speculation.TAG_BASE >= (1 << 20) + (1 << 29)  # past the ring sums' tags
