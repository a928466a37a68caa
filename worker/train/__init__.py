"""The training library's machinery: the worker's context and rendezvous link, bounded
collectives, state sync, replica checks, durable checkpointing, sampling."""
