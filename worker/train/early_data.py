"""The point-to-point transfers of one round's early data on a Gloo ring (`speculation` decides,
this moves the bytes).

`post` starts them before the round's message goes out: a receive for each peer's expected bytes
and a send of this rank's bytes to each peer. `complete`, once every rank's announcement is in,
sends the empty messages and posts the receives `speculation.match` says, then waits for every
transfer of the round, so nothing is left pending on the ring.

The waits are Gloo's own, bounded by the collective timeout: a dead peer fails them at once (its
connection closes), a hung one after the timeout. They come after the round's message has been
exchanged (every peer was alive and had posted all of its transfers), so only a peer stopped
within the transfer itself holds this rank for the timeout instead of the generation's end.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Sequence

import torch

from ringmaster.worker.train import speculation
from ringmaster.worker.train.errors import HorovodInternalError
from ringmaster.worker.train.speculation import Announcement, Speculation

_EMPTY = torch.empty(0, dtype=torch.uint8)


class EarlyData:
    """One round's early transfers on `pg` (rank `rank` of `size`), for `early` (None: this rank
    sends nothing early, but still completes what its peers sent it)."""

    def __init__(self, pg: Any, rank: int, size: int, round_number: int, early: Speculation | None,
                 timeout_s: float, generation: int) -> None:
        self.pg = pg
        self.rank = rank
        self.size = size
        self.round_number = round_number
        self.early = early
        self.announcement = early.announcement() if early is not None else Announcement.silent(size)
        self.timeout = timedelta(seconds=timeout_s)
        self.generation = generation
        self._works: list[Any] = []

    def receive(self) -> "EarlyData":
        """Post this rank's receives (before the round's message goes out: the peers hear at once
        that this rank is ready for their bytes)."""
        if self.early is not None:
            for peer, target in enumerate(self.early.targets):
                if target is not None:
                    tag = speculation.data_tag(self.round_number, target.numel())
                    self._works.append(self.pg.recv([target], peer, tag))
        return self

    def send(self) -> None:
        """Send this rank's bytes to each peer (once the round's message is on its way: it goes
        out first, so the round is not held up behind the data)."""
        if self.early is not None:
            for peer, data in enumerate(self.early.sends):
                if data is not None:
                    self._works.append(self.pg.send([data], peer,
                                                    speculation.data_tag(self.round_number, data.numel())))

    def complete(self, announcements: Sequence[Announcement]) -> tuple[bool, list[torch.Tensor | None] | None]:
        """Complete every transfer of the round. Then (whether the bytes that came complete the
        first operation: every rank sent it early; if so, each rank's bytes when some did not land
        in `early.targets`, this rank's entry None, or None when all did). When not every rank
        sent early, the operation runs as a collective and what came is dropped."""
        matching = speculation.match(self.rank, self.round_number, announcements)
        absorbed: dict[int, torch.Tensor] = {}
        try:
            for peer, tag in matching.empty_to:
                self._works.append(self.pg.send([_EMPTY], peer, tag))
            for peer, tag, nbytes in matching.absorb_from:
                absorbed[peer] = torch.empty(nbytes, dtype=torch.uint8)
                self._works.append(self.pg.recv([absorbed[peer]], peer, tag))
            for work in self._works:
                work.wait(self.timeout)
        except RuntimeError as exc:
            raise HorovodInternalError(f"an operation's data sent early failed in generation {self.generation}: "
                                       f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from exc
        finally:
            self._works.clear()
        if self.early is None or not speculation.everyone_speculated(announcements):
            return False, None
        if all(matching.landed[p] for p in range(self.size) if p != self.rank):
            return True, None
        return True, [None if p == self.rank else (self.early.targets[p] if matching.landed[p] else absorbed[p])
                      for p in range(self.size)]
