"""Refuse HTTP request bodies over a size limit before they are read (413).

An ASGI middleware: a declared `Content-Length` over the limit is answered at once, without
reading a byte of the body; a body without one (chunked) is counted as it arrives and cut off
at the limit. So no request can make the rendezvous' event loop buffer or parse a huge body.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

#: Bytes a control-API request body may have; `{"np": 8}` needs nine.
DEFAULT_MAX_BODY_BYTES = 64 * 1024

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await self._refuse(send, 400, "Content-Length is not an integer")
                return
            if length > self.max_bytes:
                await self._refuse(send, 413, self._message(length))
                return
        seen = 0
        started = refused = False

        async def counted_receive() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # Answer now and tell the app the client went away: it stops reading.
                    refused = True
                    if not started:
                        await self._refuse(send, 413, self._message(seen))
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 was the answer
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted_receive, guarded_send)

    def _message(self, size: int) -> str:
        return f"request body of {size} bytes is over the limit of {self.max_bytes} bytes; send {{\"np\": N}}"

    @staticmethod
    async def _refuse(send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
