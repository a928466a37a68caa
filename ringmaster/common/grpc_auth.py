"""Keys on the wire: a gRPC interceptor for callers (agents, workers), a guard for the rendezvous.

A caller's interceptor signs every call with its own key (`seal.CallerSeal`: its identity and a
token over the request's bytes) and checks everything that comes back before it is used: a
stream's opening proof before its first message, each streamed message's seal (in order), a
single answer's MAC (in its trailing metadata, which travels with it and costs no frame of
its own), and the MAC of a refusal that the caller would act on for good. Whatever fails is
`Unproven`: the call fails as if the rendezvous were away (the caller reconnects), so nothing
a relay or an impostor says is ever acted on.

The rendezvous' guard refuses calls whose token is missing, forged, stale or replayed with
UNAUTHENTICATED, and calls by an identity that may not make them (an agent speaking for another
host, a worker for another worker) with PERMISSION_DENIED, before the service sees them; it
counts them (a peer with many refusals gets its next ones slowly: `throttle`), and seals what
the service answers.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from ringmaster.common.errors import RingmasterError
from ringmaster.common.keys import Identity, key_of
from ringmaster.common.seal import (
    PROOF_KEY,
    TOKEN_KEY,
    Admission,
    CallerSeal,
    Gate,
    body_of,
)
from ringmaster.common.throttle import ProvenConnections, RefusalThrottle, peer_address

Clock = Callable[[], float]
#: Seconds a stream answered without headers is given to show that it ended (then its own error
#: is raised); one still open without a proof is not the job's rendezvous.
ENDED_WAIT_S = 2.0
#: Refusals a caller acts on for good (it stops, retires or drops a report): they must prove
#: the caller's key too. Others (UNAVAILABLE, DEADLINE_EXCEEDED, ...) only make it try again,
#: and UNAUTHENTICATED cannot be proven to a caller whose key is wrong.
DECISIONS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
                       grpc.StatusCode.PERMISSION_DENIED,
                       grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE,
                       grpc.StatusCode.ABORTED})


@dataclass(frozen=True)
class Credentials:
    """What a caller signs with: who it is and its key."""

    identity: Identity
    key: bytes


class Unproven(RingmasterError, grpc.RpcError):
    """An answer that does not prove it came from this job's rendezvous, in this call: it is
    not acted on. An RpcError whose code is UNAVAILABLE, so callers treat it as a rendezvous
    that is away and reconnect."""

    def __init__(self, method: str, why: str = "") -> None:
        super().__init__()
        self._details = (f"the server answering {method} did not prove it holds this caller's key: it is not this "
                         f"job's rendezvous, or something on the way changed its answer{': ' + why if why else ''}")

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

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


def _method_name(details: grpc.ClientCallDetails) -> str:
    return details.method.decode() if isinstance(details.method, bytes) else details.method


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, details: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


def _checked_error(exc: grpc.RpcError, seal: CallerSeal, method: str) -> grpc.RpcError:
    """`exc` if the caller may act on it as it is; Unproven when it is a decision without proof."""
    code = exc.code() if hasattr(exc, "code") else None
    if code is None or code not in DECISIONS:
        return exc
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    if seal.refused(_header(trailing, PROOF_KEY), code.name, exc.details() or ""):
        return exc
    return Unproven(method, f"a {code.name} refusal without proof")


class _ProvenStream:
    """A server stream whose opening proof is checked before its first message, and each
    message's seal before it is handed out."""

    def __init__(self, call: Any, seal: CallerSeal, method: str) -> None:
        self._call = call
        self._seal = seal
        self._method = method
        self._opened = False

    def __iter__(self) -> Iterator:
        return self

    def __next__(self) -> Any:
        try:
            if not self._opened:
                self._open()
            message = next(self._call)
        except Unproven:
            raise
        except grpc.RpcError as exc:
            raise _checked_error(exc, self._seal, self._method) from None
        why = self._seal.message(message)
        if why is not None:
            self._call.cancel()  # the session is not to be trusted any more: closed, and said by the caller
            raise Unproven(self._method, why)
        return message

    def _open(self) -> None:
        headers = self._call.initial_metadata()
        if not headers:
            # A call refused before any message (too big, unavailable) ends with a status and
            # no headers; its end may be recorded a moment after the (empty) headers are.
            ended = threading.Event()
            if not self._call.add_callback(ended.set):
                ended.set()  # already over
            ended.wait(ENDED_WAIT_S)
            if self._call.done():
                next(self._call)  # raises its own error (refused, unavailable), which says why
        if not self._seal.opened(_header(headers, PROOF_KEY)):
            self._call.cancel()
            raise Unproven(self._method)
        self._opened = True

    def __getattr__(self, name: str) -> Any:  # cancel(), code(), details(), ...
        return getattr(self._call, name)


class CallerAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Signs every call with the caller's key and checks that every answer proves it too."""

    def __init__(self, credentials: Credentials, clock: Clock = time.time) -> None:
        self._credentials = credentials
        self._clock = clock

    def _sign(self, details: grpc.ClientCallDetails, request: Any) -> tuple[_CallDetails, CallerSeal, str]:
        method = _method_name(details)
        seal = CallerSeal(self._credentials.key, self._credentials.identity, method, body_of(request), self._clock())
        return _CallDetails(details, [*(details.metadata or ()), *seal.metadata]), seal, method

    def intercept_unary_unary(self, continuation, client_call_details, request):
        details, seal, method = self._sign(client_call_details, request)
        outcome = continuation(details, request)
        exc = outcome.exception()
        if exc is not None:
            checked = _checked_error(exc, seal, method)
            if checked is not exc:
                raise checked
            return outcome
        if not seal.answered(_header(outcome.trailing_metadata(), PROOF_KEY), body_of(outcome.result())):
            raise Unproven(method)
        return outcome

    def intercept_unary_stream(self, continuation, client_call_details, request):
        details, seal, method = self._sign(client_call_details, request)
        return _ProvenStream(continuation(details, request), seal, method)


def secured(channel: grpc.Channel, credentials: Credentials | None) -> grpc.Channel:
    """`channel` with calls signed with `credentials` (unchanged without them)."""
    return channel if credentials is None else grpc.intercept_channel(channel, CallerAuth(credentials))


#: `authorize(method, identity, request)`: why `identity` may not make this call, or None.
Authorize = Callable[[str, Identity, Any], "str | None"]


class _SealingContext:
    """The service's context, with refusals that prove the caller's key (so it can act on them)."""

    def __init__(self, context: grpc.aio.ServicerContext, admission: Admission) -> None:
        self._context = context
        self._admission = admission

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        proof = self._admission.keys.refusal(code.name, details)
        await self._context.abort(code, details, (*tuple(trailing_metadata), (PROOF_KEY, proof)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class RendezvousAuth:
    """Lets through only calls whose token proves the caller's key and whose caller may make
    them; seals every answer. Keys are derived from the job secret on demand (`keys.key_of`).

    It guards the servicer's methods themselves (`guard`), wrapped once at start, rather than
    being a gRPC server interceptor: an interceptor runs a coroutine and builds new handlers for
    every call, which cost the rendezvous more CPU than the HMACs (bench/auth.py).
    """

    def __init__(self, secret: str, on_refused: Callable[[str, str], None],
                 identity_problem: Callable[[Identity], str | None] = lambda identity: None,
                 authorize: Authorize | None = None, clock: Clock = time.time) -> None:
        """`on_refused(method, why)` hears of every refused call; `identity_problem(identity)`
        says why a named identity cannot be one of the job's (checked before deriving its key);
        `authorize` says why an identity may not make a call (None: any identity may)."""
        self.gate = Gate(lambda identity: key_of(secret, identity), identity_problem)
        self._authorize = authorize
        self._on_refused = on_refused
        self._clock = clock
        self.refused = 0
        self.throttle = RefusalThrottle()
        self.proven = ProvenConnections()  # connections the per-peer limit never sheds

    def guard(self, servicer: object, service: ServiceDescriptor) -> object:
        """An object with `servicer`'s RPC methods of `service`, each refusing unproven calls
        first and sealing its answers; register it in the servicer's place."""
        guarded = types.SimpleNamespace()
        for method in service.methods:
            inner = getattr(servicer, method.name)
            full_name = f"/{service.full_name}/{method.name}"
            wrap = self._stream if method.server_streaming else self._unary
            setattr(guarded, method.name, wrap(full_name, method.name, inner))
        return guarded

    async def _admit(self, method: str, name: str, request: Any, context: grpc.aio.ServicerContext) -> Admission:
        """The call's admission; the call is aborted (refused) otherwise."""
        metadata = context.invocation_metadata()
        now = self._clock()
        admission, why = self.gate.check(method, _header(metadata, TOKEN_KEY), body_of(request), now)
        if admission is None:
            await self._refuse(context, method, grpc.StatusCode.UNAUTHENTICATED, why)
        assert admission is not None
        denied = self._authorize(name, admission.identity, request) if self._authorize is not None else None
        if denied:
            await self._refuse(_SealingContext(context, admission), method, grpc.StatusCode.PERMISSION_DENIED,
                               f"{admission.identity} may not: {denied}")
        replayed = self.gate.admit(admission, now)
        if replayed:
            await self._refuse(context, method, grpc.StatusCode.UNAUTHENTICATED, replayed)
        self.proven.note(context.peer())
        return admission

    async def _refuse(self, context: Any, method: str, code: grpc.StatusCode, why: str) -> None:
        self.refused += 1
        self._on_refused(method, why)
        wait = self.throttle.delay(peer_address(context.peer()), self._clock())
        if wait > 0:  # a peer with many refusals: its next ones cost it time (see `throttle`)
            self.throttle.waiting += 1
            try:
                await asyncio.sleep(wait)
            finally:
                self.throttle.waiting -= 1
        await context.abort(code, f"{method} refused: {why}")

    def _unary(self, method: str, name: str, inner: Callable) -> Callable:
        async def unary(request, context):
            admission = await self._admit(method, name, request, context)
            answer = inner(request, _SealingContext(context, admission))
            answer = await answer if inspect.isawaitable(answer) else answer  # (the generated base's are plain)
            context.set_trailing_metadata(((PROOF_KEY, admission.keys.answer(body_of(answer))),))
            return answer

        return unary

    def _stream(self, method: str, name: str, inner: Callable) -> Callable:
        async def stream(request, context):
            admission = await self._admit(method, name, request, context)
            await context.send_initial_metadata(((PROOF_KEY, admission.keys.opening()),))
            messages = inner(request, _SealingContext(context, admission))
            if inspect.isasyncgen(messages):
                async for message in messages:
                    yield admission.seal(message)
            else:
                for message in messages:  # (the generated base's are plain)
                    yield admission.seal(message)

        return stream
