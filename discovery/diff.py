"""What changed between two host sets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class HostDiff:
    added: dict[str, int] = field(default_factory=dict)
    removed: dict[str, int] = field(default_factory=dict)
    #: host -> (old slots, new slots)
    resized: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.resized)

    def describe(self) -> str:
        parts = []
        if self.added:
            parts.append("added " + ", ".join(f"{h}:{s}" for h, s in self.added.items()))
        if self.removed:
            parts.append("removed " + ", ".join(self.removed))
        if self.resized:
            parts.append("resized " + ", ".join(f"{h}:{a}->{b}" for h, (a, b) in self.resized.items()))
        return "; ".join(parts) or "no change"


def diff_hosts(old: Mapping[str, int], new: Mapping[str, int]) -> HostDiff:
    """Compare two host sets (order is not a change)."""
    return HostDiff(
        added={h: s for h, s in new.items() if h not in old},
        removed={h: s for h, s in old.items() if h not in new},
        resized={h: (old[h], s) for h, s in new.items() if h in old and old[h] != s},
    )
