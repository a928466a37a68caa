"""The host agent: a daemon that keeps its host's training processes matching the rendezvous."""
