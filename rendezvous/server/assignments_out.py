"""When the last assignment of a generation left the rendezvous.

A new generation is ready for training only once every member holds its assignment; what the
rendezvous controls is the part until the last of those messages is handed to gRPC to write to
its stream (or to the agent that carries it). This watches the newest generation's assignment
messages as the sessions hand them over, so that part is measured in the service itself (the
metrics and `/status` show it), apart from how fast the workers' side takes them in. Messages
are told apart by identity: each is a distinct object from the moment it is queued until a
session hands it over, moves it elsewhere or drops it with its session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass
class _Outgoing:
    number: int
    began: float  # (the service's clock) the failure seen, or the change that formed the generation
    pending: set[int] = field(default_factory=set)


class AssignmentsOut:
    """The newest generation's assignment messages not yet handed over; `handed_over` says when the last went."""

    def __init__(self) -> None:
        self._outgoing: _Outgoing | None = None
        self._done = 0  # the newest generation whose assignments all went (one sent again later is no news)

    @property
    def watching(self) -> bool:
        return self._outgoing is not None and bool(self._outgoing.pending)

    def queued(self, number: int, began: float, messages: Iterable[Any]) -> None:
        """`messages` carry assignments of generation `number`, whose change began at `began`; a
        newer generation replaces an older one still going out (its messages no longer matter)."""
        out = self._outgoing
        if number <= self._done or (out is not None and out.number > number):
            return  # (said again to a worker that reconnected, or an older generation's: no news)
        if out is None or out.number < number:
            out = self._outgoing = _Outgoing(number, began)
        out.pending.update(id(message) for message in messages)

    def moved(self, message: Any, into: Iterable[Any]) -> None:
        """`message` was not handed over: what it carried went on as `into` (another session's)."""
        out = self._outgoing
        if out is not None and id(message) in out.pending:
            out.pending.discard(id(message))
            out.pending.update(id(item) for item in into)

    def dropped(self, messages: Iterable[Any]) -> None:
        """Messages left with a session that ended (nobody to tell any more)."""
        out = self._outgoing
        if out is not None:
            out.pending.difference_update(id(message) for message in messages)

    def handed_over(self, message: Any, now: float) -> tuple[int, float] | None:
        """A session handed `message` to gRPC: (generation, seconds since its change began) if it
        was the last of its generation's assignments to go, else None."""
        out = self._outgoing
        if out is None or id(message) not in out.pending:
            return None
        out.pending.discard(id(message))
        if out.pending:
            return None
        self._outgoing = None
        self._done = out.number
        return out.number, max(0.0, now - out.began)
