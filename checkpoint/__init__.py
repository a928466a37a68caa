"""Commits and checkpoints of training state.

`memory` holds in-memory commits: snapshots taken at `state.commit()` and copied back at
`state.restore()`.
"""

from checkpoint.memory import restore_state_dict, snapshot

__all__ = ["restore_state_dict", "snapshot"]
