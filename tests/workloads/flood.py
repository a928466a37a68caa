"""Hold many idle TCP connections to an address, opening a new one for each the server closes.

    python flood.py HOST PORT COUNT [--http]

With --http each connection sends the first bytes of a request and nothing more (a stalled
HTTP client). Prints "open N" once COUNT are open, then runs until killed. Its own process
holds the descriptors, so the test's process is not limited by them.
"""

from __future__ import annotations

import resource
import selectors
import socket
import sys


def main() -> None:
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    http = "--http" in sys.argv
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    selector = selectors.DefaultSelector()

    def connect() -> None:
        sock = socket.socket()
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
                connect()  # the server closed it: open another


if __name__ == "__main__":
    main()
