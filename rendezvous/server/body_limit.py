"""Refuse HTTP request bodies over a size limit before they are read (413).

An ASGI middleware: a declared `Content-Length` over the limit is answered at once, without
keeping a byte of the body; a body without one (chunked) is counted as it arrives and cut off
at the limit. So no request can make the rendezvous' event loop buffer or parse a huge body.
Before the 413 goes out, what the client keeps sending of the body is read and dropped (for at
most `DRAIN_S`, and only while bytes keep coming: a client that sent its headers alone, or asked
`Expect: 100-continue`, is answered at once): a client that sends its whole body before it reads
the answer (most do) would otherwise find the connection reset under it, the unread bytes turning
the server's close into a reset, and never see the 413.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

#: Bytes a control-API request body may have; `{"np": 8}` needs nine.
DEFAULT_MAX_BODY_BYTES = 64 * 1024
#: Seconds the rest of a refused body is read and dropped, at most, before the 413 goes out...
DRAIN_S = 10.0
#: ... and how long a pause in its bytes ends that (the client sends nothing more: answer now).
DRAIN_IDLE_S = 0.3

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 hint: str = 'send {"np": N}') -> None:
        """`hint`: what a body of this API holds, said in the 413 (each API its own fields)."""
        self.app = app
        self.max_bytes = max_bytes
        self.hint = hint

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
                waits = dict(scope.get("headers") or []).get(b"expect", b"").lower() == b"100-continue"
                drained = not waits and await _drain(receive)
                await self._refuse(send, 413, self._message(length), close=not drained)
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
                        drained = not message.get("more_body", False) or await _drain(receive)
                        await self._refuse(send, 413, self._message(seen), close=not drained)
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
        return f"request body of {size} bytes is over the limit of {self.max_bytes} bytes; {self.hint}"

    @staticmethod
    async def _refuse(send: Send, status: int, detail: str, close: bool = True) -> None:
        """Answer `status`; with `close`, the connection closes after it (a body left unread)."""
        body = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status,
                    "headers": headers + ([(b"connection", b"close")] if close else [])})
        await send({"type": "http.response.body", "body": body})


async def _drain(receive: Receive) -> bool:
    """Read and drop what is left of a refused body while it keeps coming (at most `DRAIN_S`, a
    pause of `DRAIN_IDLE_S` ends it); True when the whole body was read."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_S
    while (left := deadline - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(receive(), min(DRAIN_IDLE_S, left))
        except TimeoutError:
            return False
        if message["type"] != "http.request":
            return False
        if not message.get("more_body", False):
            return True
    return False
