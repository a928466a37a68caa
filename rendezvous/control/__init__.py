"""The rendezvous' decisions: records, rank assignment, worker environments, the coordinator.
Pure logic over dataclasses; nothing here does I/O."""
