"""Commits and checkpoints of training state.

- `tree`: split a state into its tensors and a tensor-free skeleton.
- `memory`: in-memory commits in reused host buffers (`HostSnapshot`).
- `manifest`, `directory`: durable checkpoints on disk (atomic, checksummed, kept K deep).
- `writer`: writes checkpoints off the training thread.
- `policy`: when a durable checkpoint is due.
"""
