"""Which hosts are kept out of the job after their workers failed, and for how long.

Horovod's rule: a host whose worker fails is blacklisted. With a cooldown range ``(L, U)`` it
may come back: the first cooldown is L seconds, each further failure doubles it up to U, and a
random jitter of up to 10% spreads hosts that failed together. Without a range the blacklist is
permanent. Time is passed in, so the rules are tested without waiting.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class CooldownRange:
    lower_s: float
    upper_s: float

    def __post_init__(self) -> None:
        if not (0 < self.lower_s <= self.upper_s):
            raise ValueError(
                f"--blacklist-cooldown-range needs 0 < MIN <= MAX seconds, got {self.lower_s:g} {self.upper_s:g}"
            )

    def cooldown(self, failures: int, jitter: float) -> float:
        """Cooldown after the `failures`-th failure (1-based); `jitter` in [0, 1)."""
        base = min(self.lower_s * 2 ** (failures - 1), self.upper_s)
        return min(base * (1.0 + 0.1 * jitter), self.upper_s) if base < self.upper_s else base


@dataclass
class _Entry:
    failures: int
    until: float  # monotonic seconds; inf for permanent


class Blacklist:
    def __init__(self, cooldown: CooldownRange | None = None, rng: random.Random | None = None) -> None:
        self._cooldown = cooldown
        self._rng = rng or random.Random()
        self._entries: dict[str, _Entry] = {}
        self.changes = 0  # failures recorded (what was worked out from the blacklist holds while it stands)

    def record_failure(self, host: str, now: float) -> float:
        """Blacklist `host` from `now`; returns the cooldown in seconds (inf when permanent)."""
        entry = self._entries.get(host)
        failures = entry.failures + 1 if entry else 1
        if self._cooldown is None:
            cooldown = float("inf")
        else:
            cooldown = self._cooldown.cooldown(failures, self._rng.random())
        self._entries[host] = _Entry(failures, now + cooldown)
        self.changes += 1
        return cooldown

    def is_blacklisted(self, host: str, now: float) -> bool:
        entry = self._entries.get(host)
        return entry is not None and now < entry.until

