"""What the rendezvous' gRPC server holds at most, so that idle or stalled connections, which
anyone who can reach its port can open without a key, never take its file descriptors.

- Connections in all: at most `max_connections(open files)`; gRPC closes one more as soon as it
  is accepted. Half of the descriptors left after a reserve, so the control API, the rings'
  store and the store client always have some.
- A connection that has not finished its HTTP/2 handshake within `HANDSHAKE_TIMEOUT_S` is closed
  (a TCP connection that says nothing).
- A connection with no call in flight for `IDLE_TIMEOUT_S` is closed: every agent and worker
  keeps its session's stream open for as long as it lives, so only idle strangers go.

Pure: the options are built here; `app` hands them to `grpc.aio.server`.
"""

from __future__ import annotations

#: Largest gRPC message the rendezvous accepts (no message of the protocol comes near it).
MAX_MESSAGE_BYTES = 1 << 20
#: Most connections whatever the descriptor limit (4,096 hosts with an agent and 8 workers each
#: would need 36,864: their processes can share connections, see the scale issue).
MAX_CONNECTIONS = 40_000
#: Descriptors kept for everything else the rendezvous opens.
RESERVED_FILES = 1024
#: Seconds a new connection has to finish its HTTP/2 handshake.
HANDSHAKE_TIMEOUT_S = 10.0
#: Seconds a connection may stay without a call in flight.
IDLE_TIMEOUT_S = 60.0
#: Calls that may wait for the rendezvous' event loop to take them (gRPC's core refuses calls,
#: CANCELLED, beyond 1,000 by default, more and more of them up to 3,000): every agent and
#: worker of a large job calls at once when it forms or when a new rendezvous takes over, and
#: they must wait their turn, not be turned away. Bounded by the connections it takes (each
#: carries at most a few of a job's calls at a time).
MAX_PENDING_CALLS = 40_000


def max_connections(open_files: int) -> int:
    """Connections the gRPC server keeps at most with a soft descriptor limit of `open_files`."""
    return max(64, min(MAX_CONNECTIONS, (open_files - RESERVED_FILES) // 2))


def server_options(open_files: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_allowed_incoming_connections", max_connections(open_files)),
        ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
        ("grpc.max_connection_idle_ms", int(IDLE_TIMEOUT_S * 1000)),
        ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_CALLS),
    ]
