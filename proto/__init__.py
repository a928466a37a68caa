"""The gRPC contract of Ringmaster: `ringmaster.proto` and the stubs generated from it."""
