"""The job secret on the wire: a gRPC interceptor for callers (agents, workers), a guard for the rendezvous.

A caller's interceptor adds a fresh token to every call and checks the proof in the answer
before anything of it is used (a stream's headers, before its first message; a single answer's
trailers, which travel with it and cost no frame of their own): an answer without a good proof fails the call
with UNAUTHENTICATED, so an agent never acts on commands from something posing as the
rendezvous. The rendezvous' guard refuses calls whose token is missing, forged, stale or
replayed with UNAUTHENTICATED before the service sees them, and counts them.
"""

from __future__ import annotations

import inspect
import threading
import time
import types
from typing import Any, Callable, Iterator

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from ringmaster.common.errors import RingmasterError
from ringmaster.common.secret import PROOF_KEY, TOKEN_KEY, TokenChecker, make_proof, make_token, proof_is_good

Clock = Callable[[], float]
#: Seconds a stream answered without headers is given to show that it ended (then its own error
#: is raised); one still open without a proof is not the job's rendezvous.
ENDED_WAIT_S = 2.0


class Unproven(RingmasterError, grpc.RpcError):
    """The answer did not prove it came from this job's rendezvous (an RpcError, so callers that
    handle a failed call handle it too)."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self._details = (f"the server answering {method} did not prove it knows the job secret: it is not this job's "
                         "rendezvous (or runs with another secret)")

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAUTHENTICATED

    def details(self) -> str:
        return self._details

    def __str__(self) -> str:
        return self._details


def _header(metadata: Any, key: str) -> str | None:
    for item in metadata or ():
        if item[0] == key:
            value = item[1]
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return None


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, details: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class _ProvenStream:
    """A server stream whose headers are checked before its first message is handed out."""

    def __init__(self, call: Any, check: Callable[[Any], None]) -> None:
        self._call = call
        self._check: Callable[[Any], None] | None = check

    def __iter__(self) -> Iterator:
        return self

    def __next__(self) -> Any:
        if self._check is not None:
            headers = self._call.initial_metadata()
            if not headers:
                # A call refused before any message (too big, unavailable) ends with a status and
                # no headers; its end may be recorded a moment after the (empty) headers are.
                ended = threading.Event()
                if not self._call.add_callback(ended.set):
                    ended.set()  # already over
                ended.wait(ENDED_WAIT_S)
                if self._call.done():
                    return next(self._call)  # its own error (refused, unavailable) says why
            self._check(headers)
            self._check = None
        return next(self._call)

    def __getattr__(self, name: str) -> Any:  # cancel(), code(), details(), ...
        return getattr(self._call, name)


class CallerAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Signs every call with the job secret and checks that the answer proves it too."""

    def __init__(self, secret: str, clock: Clock = time.time) -> None:
        self._secret = secret
        self._clock = clock

    def _sign(self, details: grpc.ClientCallDetails) -> tuple[_CallDetails, Callable[[Any], None]]:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        token, nonce = make_token(self._secret, method, self._clock())
        metadata = [*(details.metadata or ()), (TOKEN_KEY, token)]

        def check(headers: Any) -> None:
            if not proof_is_good(self._secret, nonce, _header(headers, PROOF_KEY)):
                raise Unproven(method)

        return _CallDetails(details, metadata), check

    def intercept_unary_unary(self, continuation, client_call_details, request):
        details, check = self._sign(client_call_details)
        outcome = continuation(details, request)
        if outcome.exception() is None:  # an error answer is the error (the proof matters for what is acted on)
            check(outcome.trailing_metadata())
        return outcome

    def intercept_unary_stream(self, continuation, client_call_details, request):
        details, check = self._sign(client_call_details)
        return _ProvenStream(continuation(details, request), check)


def secured(channel: grpc.Channel, secret: str | None) -> grpc.Channel:
    """`channel` with calls signed by `secret` (unchanged without one)."""
    return channel if secret is None else grpc.intercept_channel(channel, CallerAuth(secret))


class RendezvousAuth:
    """Lets through only calls signed with the job secret, and proves the secret in the answer.

    It guards the servicer's methods themselves (`guard`), wrapped once at start, rather than
    being a gRPC server interceptor: an interceptor runs a coroutine and builds new handlers for
    every call, which cost the rendezvous more CPU than the HMACs (bench/auth.py).
    """

    def __init__(self, secret: str, on_refused: Callable[[str, str], None], clock: Clock = time.time) -> None:
        """`on_refused(method, why)` hears of every refused call."""
        self._secret = secret
        self._checker = TokenChecker(secret)
        self._on_refused = on_refused
        self._clock = clock
        self.refused = 0

    def guard(self, servicer: object, service: ServiceDescriptor) -> object:
        """An object with `servicer`'s RPC methods of `service`, each refusing unsigned calls
        first; register it in the servicer's place."""
        guarded = types.SimpleNamespace()
        for method in service.methods:
            inner = getattr(servicer, method.name)
            full_name = f"/{service.full_name}/{method.name}"
            wrap = self._stream if method.server_streaming else self._unary
            setattr(guarded, method.name, wrap(full_name, inner))
        return guarded

    def _admit(self, method: str, context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...] | str:
        """The proof to answer with, or why the call is refused."""
        nonce, why = self._checker.check(method, _header(context.invocation_metadata(), TOKEN_KEY), self._clock())
        if nonce is None:
            self.refused += 1
            self._on_refused(method, why)
            return f"{method} refused: {why}"
        return ((PROOF_KEY, make_proof(self._secret, nonce)),)

    def _unary(self, method: str, inner: Callable) -> Callable:
        async def unary(request, context):
            proof = self._admit(method, context)
            if isinstance(proof, str):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, proof)
            context.set_trailing_metadata(proof)  # sent with the answer, not as a frame of its own
            answer = inner(request, context)
            return await answer if inspect.isawaitable(answer) else answer  # (the generated base's are plain)

        return unary

    def _stream(self, method: str, inner: Callable) -> Callable:
        async def stream(request, context):
            proof = self._admit(method, context)
            if isinstance(proof, str):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, proof)
            await context.send_initial_metadata(proof)
            messages = inner(request, context)
            if inspect.isasyncgen(messages):
                async for message in messages:
                    yield message
            else:
                for message in messages:  # (the generated base's are plain)
                    yield message

        return stream
