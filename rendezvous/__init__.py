"""The rendezvous: `control` decides (pure, no I/O), `server` runs it (gRPC, HTTP, discovery
polling, the torch store, local hosts), `state` keeps it durable (kv stores, job record,
journal, leadership, agent leases)."""
