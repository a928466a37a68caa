"""When a durable checkpoint is due: every N commits, or every T seconds, whichever is asked.

Pure: the caller passes the commit count and the time, so the rule is tested without clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringmaster.settings import DEFAULT_CHECKPOINT_INTERVAL_S


@dataclass
class CheckpointPolicy:
    every: int | None = None
    interval_s: float | None = None
    _last_step: int = field(default=0, init=False)
    _last_time: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.every is not None and self.every < 1:
            raise ValueError(f"--checkpoint-every must be at least 1 commit, not {self.every}")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError(f"--checkpoint-interval must be positive, not {self.interval_s:g}")
        if self.every is None and self.interval_s is None:
            self.interval_s = DEFAULT_CHECKPOINT_INTERVAL_S

    def start(self, step: int, now: float) -> None:
        """The state is at `step` (fresh, restored or loaded) at `now`: count from here."""
        self._last_step, self._last_time = step, now

    def due(self, step: int, now: float) -> bool:
        if self._last_time is None:
            self._last_time = now  # the clock of --checkpoint-interval starts at the first commit
        if step <= self._last_step:
            return False
        if self.every is not None and step - self._last_step >= self.every:
            return True
        return self.interval_s is not None and now - self._last_time >= self.interval_s

    def written(self, step: int, now: float) -> None:
        self.start(step, now)
