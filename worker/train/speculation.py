"""Sending an operation's data before the ranks agree on it, pure: which transfers a round's
first operation makes at once, and how every one of them is matched once the round is known.

An allgather, alltoall or reducescatter through the operation queue used to cost its agreement
round (one small allgather) and then its own collective, one after the other; at 1 MB on 2 ranks
the round alone is a fifth of the collective. Here the first operation of a round moves its data
point to point *while* the round runs: each rank sends its bytes for each peer at once and posts
a receive for the bytes it expects from each peer, assuming the peers issue what it issues. The
round's message says what each rank sent to whom and expected from whom (`Announcement`), so
once it is in, every rank knows every transfer of the round and completes each exactly once, also
where the guess was wrong (a peer issued another operation, or sent another number of bytes):

- a receive posted for bytes that did not come is completed by its sender with an empty message;
- bytes sent where no receive of that size was posted are taken into a receive of their size.

Nothing is left pending on the ring, whatever the ranks issued, so a refused operation leaves the
ring usable and never lands bytes anywhere but in buffers of their own size. Gloo matches
point-to-point messages by tag and takes a message of at most the posted size, so the tag of a
transfer says its byte count (`data_tag`): a message can only meet a receive of exactly its size.

Only operations of under `MAX_BYTES` per peer, on rings of at most `MAX_RANKS`, are sent early:
above that the round costs a few percent of the transfer and is not worth the tag space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

#: Ranks a round's message can announce early data for (its layout: `Announcement.words`).
ANNOUNCED_RANKS = 8
#: Ranks a ring may have for its operations' data to be sent early (each rank sends to each peer;
#: at most ANNOUNCED_RANKS).
MAX_RANKS = ANNOUNCED_RANKS


def ring_sends_early(size: int) -> bool:
    """Can a ring of `size` ranks send data early (every rank's transfers fit a message)?"""
    return size <= min(MAX_RANKS, ANNOUNCED_RANKS)
#: Bytes per peer below which an operation's data is sent early (also the tags one round spans).
MAX_BYTES = 1 << 22
#: Rounds whose tags differ before they are used again (a round's transfers all end within it).
ROUNDS = 256
#: The first tag of these transfers: apart from the communicator's own (0) and the ring sums'
#: ([2^20, 2^20 + 2^29)); Gloo's point-to-point tags are 31-bit here.
TAG_BASE = 1 << 30
#: A peer that sent or expects nothing.
NONE = -1


def data_tag(round_number: int, nbytes: int) -> int:
    """The tag of a transfer of `nbytes` in round `round_number` (the same on every rank)."""
    if not 0 <= nbytes < MAX_BYTES:
        raise ValueError(f"a transfer sent early carries 0 to {MAX_BYTES - 1} bytes, not {nbytes}")
    return TAG_BASE + (round_number % ROUNDS) * MAX_BYTES + nbytes


@dataclass(frozen=True)
class Speculation:
    """An operation's data as this rank sends it before the round: `sends[j]` the bytes for rank
    j and `targets[j]` where rank j's bytes are expected (1-D uint8, their size the bytes
    expected; None for this rank). `finish(payloads)` gives the operation's output: with None
    when every peer's bytes landed in `targets`, else with each rank's bytes as they came (this
    rank's entry None)."""

    sends: Sequence[torch.Tensor | None]
    targets: Sequence[torch.Tensor | None]
    finish: Callable[[list[torch.Tensor | None] | None], Any]

    def announcement(self) -> "Announcement":
        return Announcement([NONE if t is None else t.numel() for t in self.sends],
                            [NONE if t is None else t.numel() for t in self.targets])

    def fits(self, size: int) -> bool:
        """Can it go early on a ring of `size`: every transfer within `MAX_BYTES`."""
        return (ring_sends_early(size) and len(self.sends) == len(self.targets) == size
                and all(t is None or t.numel() < MAX_BYTES for t in (*self.sends, *self.targets)))


@dataclass(frozen=True)
class Announcement:
    """What one rank's message says of its first operation's early data: the bytes it sent to
    each rank and expects from each (NONE: nothing), by rank."""

    sent: list[int]
    expected: list[int]

    @staticmethod
    def silent(size: int) -> "Announcement":
        return Announcement([NONE] * size, [NONE] * size)

    def words(self) -> list[int]:
        """The message's words for it (`ANNOUNCED_RANKS` sent, then as many expected)."""
        pad = [NONE] * (ANNOUNCED_RANKS - len(self.sent))
        return [*self.sent, *pad, *self.expected, *pad]

    @staticmethod
    def from_words(words: Sequence[int], size: int, rank: int) -> "Announcement":
        """Rank `rank`'s announcement from its message's words, checked: a ring's peer is this
        job's own worker, but its bytes decide what this rank receives, so an impossible count is
        refused (ValueError naming it), never used."""
        sent, expected = list(words[:size]), list(words[ANNOUNCED_RANKS: ANNOUNCED_RANKS + size])
        for what, counts in (("sent", sent), ("expected", expected)):
            if any(not NONE <= c < MAX_BYTES for c in counts):
                raise ValueError(f"rank {rank}'s round message says it {what} {counts} bytes early; each is "
                                 f"{NONE} (none) or 0 to {MAX_BYTES - 1}")
        to_peers = [c for peer, c in enumerate(sent) if peer != rank]
        if (NONE in to_peers and any(c != NONE for c in to_peers)) or sent[rank] != NONE or expected[rank] != NONE:
            raise ValueError(f"rank {rank}'s round message announces early data {sent} / {expected} that no rank "
                             "sends: to every peer or to none, never to itself")
        return Announcement(sent, expected)

    @property
    def speculated(self) -> bool:
        return any(c != NONE for c in self.sent)


@dataclass(frozen=True)
class Matching:
    """How this rank completes every early transfer of a round with peer j once all
    announcements are in: `empty_to` (peer, tag): an empty message completes the peer's receive
    that got nothing from this rank; `absorb_from` (peer, tag, bytes): a receive of that size
    takes bytes the peer sent where this rank expected other; `landed[j]`: peer j's bytes are in
    this rank's target."""

    empty_to: list[tuple[int, int]]
    absorb_from: list[tuple[int, int, int]]
    landed: list[bool]


def match(rank: int, round_number: int, announcements: Sequence[Announcement]) -> Matching:
    """Every rank's announcement (in rank order) -> how this rank completes its transfers. Each
    message is met by exactly one receive of its size: a peer's data by this rank's target when
    the sizes agree, else by a receive of its own; this rank's target, when the peer sent it
    nothing or another size, by an empty message the peer sends."""
    mine = announcements[rank]
    empty_to: list[tuple[int, int]] = []
    absorb_from: list[tuple[int, int, int]] = []
    landed = [False] * len(announcements)
    for peer, theirs in enumerate(announcements):
        if peer == rank:
            continue
        they_sent, they_expect = theirs.sent[rank], theirs.expected[rank]
        if they_expect != NONE and mine.sent[peer] != they_expect:
            empty_to.append((peer, data_tag(round_number, they_expect)))
        if they_sent != NONE and they_sent != mine.expected[peer]:
            absorb_from.append((peer, data_tag(round_number, they_sent), they_sent))
        landed[peer] = they_sent != NONE and they_sent == mine.expected[peer]
    return Matching(empty_to, absorb_from, landed)


def everyone_speculated(announcements: Sequence[Announcement]) -> bool:
    """Did every rank send its first operation early (then the bytes alone complete it)?"""
    return all(a.speculated for a in announcements)
