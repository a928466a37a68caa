"""Finding the rendezvous again: a list of addresses tried in turn, with backoff and a deadline.

A rendezvous with standbys has several addresses; only the leader listens, so a client tries
each, waits a little longer after every full round (0.1 s doubling up to 2 s), and gives up
after the reconnect timeout. Pure logic apart from the clock and the sleep.
"""

from __future__ import annotations

import time
from typing import Callable

#: Seconds between the first two rounds over the addresses; doubled per round up to MAX_DELAY_S.
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 2.0
#: How long one address may take to accept before the next is tried.
CONNECT_TIMEOUT_S = 1.0
#: The longest a client with two addresses (a leader and its standby) goes between two tries of
#: the one that answers: a round's delay and a connect timeout per address. A rendezvous that took
#: over counts a client's silence from this long after it began to serve, not from then.
LONGEST_GAP_S = MAX_DELAY_S + 2 * CONNECT_TIMEOUT_S


def parse_addresses(value: str) -> list[str]:
    """'h1:1,h2:2' -> ['h1:1', 'h2:2'] (blanks dropped, order kept)."""
    return [part.strip() for part in value.split(",") if part.strip()]


class Backoff:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._sleep = sleep
        self.connect_timeout_s = CONNECT_TIMEOUT_S
        self._tried = 0  # never reset: after a loss the round goes on from the next address
        self.reset()

    def reset(self) -> None:
        """Connected: the next loss starts a fresh deadline and short delays."""
        self._deadline = self._clock() + self.timeout_s
        self._delay = FIRST_DELAY_S

    def next_address(self, addresses: list[str]) -> str | None:
        """The address to try now (after sleeping between rounds); None past the deadline."""
        if self._tried and self._tried % len(addresses) == 0:
            if self._clock() >= self._deadline:
                return None
            self._sleep(min(self._delay, max(0.0, self._deadline - self._clock())))
            self._delay = min(self._delay * 2, MAX_DELAY_S)
        address = addresses[self._tried % len(addresses)]
        self._tried += 1
        return address
