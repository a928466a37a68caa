"""The rendezvous at run time: one asyncio loop with the gRPC service, the control API, the
discovery poller, the torch.distributed store host and local host emulation."""
