"""Hold many idle TCP connections to an address, opening a new one for each the server closes.

    python flood.py HOST PORT COUNT [--http] [--from ADDRESS] [--no-renew]

With --http each connection sends the first bytes of a request and nothing more (a stalled
HTTP client); --from binds them to ADDRESS (another loopback address is another peer);
--no-renew leaves closed connections closed and prints "closed N" as their count grows.
Prints "open N" once COUNT are open, then runs until killed. Its own process holds the
descriptors, so the test's process is not limited by them.
"""

from __future__ import annotations

import resource
import selectors
import socket
import sys


def main() -> None:
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    http = "--http" in sys.argv
    renew = "--no-renew" not in sys.argv
    source = sys.argv[sys.argv.index("--from") + 1] if "--from" in sys.argv else None
    closed = 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    selector = selectors.DefaultSelector()

    def connect() -> None:
        sock = socket.socket()
        if source is not None:
            sock.bind((source, 0))
        sock.setblocking(False)
        sock.connect_ex((host, port))
        selector.register(sock, selectors.EVENT_READ)
        if http:
            try:
                sock.send(b"GET /status HTTP/1.1\r\n")  # and never the rest
            except OSError:
                pass

    for _ in range(count):
        connect()
    print(f"open {count}", flush=True)
    while True:
        for key, _ in selector.select(1.0):
            sock = key.fileobj
            try:
                gone = sock.recv(4096) == b""  # type: ignore[union-attr]
            except OSError:
                gone = True
            if gone:
                selector.unregister(sock)
                sock.close()  # type: ignore[union-attr]
                if renew:
                    connect()  # the server closed it: open another
                else:
                    closed += 1
                    print(f"closed {closed}", flush=True)


if __name__ == "__main__":
    main()
