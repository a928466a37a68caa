"""Answer only requests addressed to this control API by a name that means it (DNS rebinding).

A web page on any site can make a browser on this machine send requests to 127.0.0.1 under a
name of the attacker's (its DNS answer changed to 127.0.0.1 after the page loaded): the
browser then lets the page read the answers, since they come from "its" site. Such a request
carries the attacker's name in its `Host` header; this ASGI middleware answers it 421 unless
the name is this machine's (`is_this_machine`) or the address the API was configured with.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Iterable

from ringmaster.common.network import LOOPBACK_NAMES, is_this_machine

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def host_of(header: str) -> str:
    """The name in a Host header, without its port (`[::1]:80` -> `::1`)."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0] if value.count(":") == 1 else value


class HostCheck:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], names: Iterable[str]) -> None:
        """`names`: what means this machine (its names and addresses, the API's configured address)."""
        self.app = app
        self.names = {name.lower() for name in names if name} | set(LOOPBACK_NAMES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        name = host_of(header)
        if name and is_this_machine(name, self.names):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": f"this control API answers requests addressed to this machine only, not to "
                                     f"{header[:100]!r}; use the URL the job printed"}).encode()
        await send({"type": "http.response.start", "status": 421,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
