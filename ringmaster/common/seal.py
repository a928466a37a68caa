"""Every message of a call authenticated: the request, each streamed message, the answer, a refusal.

A caller proves its key (`keys`) with a token in the call's metadata: its identity, a timestamp,
its call's number and an HMAC under its key over all that, the method and the request's bytes,
so a token is good for that one request and nothing else. The answering side picks a nonce of its own; both then derive
the call's session key from the caller's key, its token and that nonce. Under the session key:
- the stream's opening carries a proof (the server knows the caller's key: it is the job's);
- every streamed message carries a `seal` (its sequence number, from 1, and a MAC over its
  bytes, its direction and that number), so a relay that does not hold the key can insert,
  reorder, replay, drop or swap nothing without the receiver noticing;
- a single answer, and a refusal (status code and details), carry a MAC in the trailing metadata.

Replays: each caller process numbers its calls 1, 2, 3, ... under a random name of its own
(`next_call`), so a restarted caller starts a new series; the answering side remembers, per
identity and series, the highest number and which of the `REPLAY_SLACK` numbers below it it has
seen (`Replays`: calls of one process that overtake each other on the way are fine, a number
seen before is not), and refuses a token more than `TOKEN_WINDOW_S` away from its clock, which
covers the series it has forgotten. Memory grows with caller processes, not with calls.

Pure: bytes, strings and protobuf messages in, verdicts out; `grpc_auth` puts it on the wire.
Confidentiality (command lines and environments are readable on the wire) is TLS's job.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from ringmaster.common.keys import Identity

#: Metadata keys: the caller's token (`v2|IDENTITY|STAMP|SERIES|NUMBER|MAC`); the answer's proof.
TOKEN_KEY = "ringmaster-auth"
PROOF_KEY = "ringmaster-proof"
VERSION = "v2"
#: Seconds a token is good for on either side of its timestamp (clock skew between hosts included).
TOKEN_WINDOW_S = 300.0
#: Calls of one caller that may arrive out of order (its threads call at once); older ones are refused.
REPLAY_SLACK = 1024
#: Callers remembered at most; a new caller beyond it is refused until older ones expire.
MAX_CALLERS = 1 << 18
#: Identities whose keys are kept (deriving one again costs two HMACs).
MAX_KEPT_KEYS = 1 << 16
_MAX_TOKEN_CHARS = 800
_MAX_PROOF_CHARS = 128


def body_of(message: Any) -> bytes:
    """The bytes a MAC covers: the message's deterministic encoding (its `seal` left out by the caller)."""
    return message.SerializeToString(deterministic=True)


def _mac(key: bytes, head: str, body: bytes = b"") -> bytes:
    mac = hmac.new(key, head.encode(), hashlib.sha256)
    if body:
        mac.update(b"\n")
        mac.update(body)
    return mac.digest()


_SERIES = secrets.token_hex(8)  # this process' series of calls
_calls_lock = threading.Lock()
_calls = 0


def next_call() -> tuple[str, int]:
    """This process' series and the number of its next call (from 1, one more each time)."""
    global _calls
    with _calls_lock:
        _calls += 1
        return _SERIES, _calls


def _call_head(method: str, identity: str, stamp: str, series: str, number: int) -> str:
    return f"call\n{method}\n{identity}\n{stamp}\n{series}\n{number}"


def make_token(key: bytes, identity: Identity, method: str, body: bytes, now: float,
               call: tuple[str, int] | None = None) -> str:
    """The token for a call of `method` by `identity` carrying `body`, at `now` (epoch seconds);
    `call` is its (series, number), this process' next by default."""
    series, number = next_call() if call is None else call
    stamp = f"{now:.3f}"
    head = identity.header()
    mac = _mac(key, _call_head(method, head, stamp, series, number), body).hex()
    return f"{VERSION}|{head}|{stamp}|{series}|{number}|{mac}"


def call_metadata(key: bytes, identity: Identity, method: str, body: bytes, now: float) -> tuple[tuple[str, str], ...]:
    """The metadata that signs one call (for callers that build their own, such as benchmarks)."""
    return ((TOKEN_KEY, make_token(key, identity, method, body, now)),)


class SessionKeys:
    """The MACs of one call's answers, under its session key; both ends build one."""

    def __init__(self, key: bytes, method: str, token: str, nonce: str) -> None:
        self.nonce = nonce
        self._key = _mac(key, f"session\n{method}\n{token}\n{nonce}")

    def opening(self) -> str:
        return f"{VERSION}.{self.nonce}.{_mac(self._key, 'open').hex()}"

    def answer(self, body: bytes) -> str:
        return f"{VERSION}.{self.nonce}.{_mac(self._key, 'answer', body).hex()}"

    def refusal(self, code: str, details: str) -> str:
        mac = _mac(self._key, "refusal\n" + code, details.encode())
        return f"{VERSION}.{self.nonce}.{mac.hex()}"

    def message_mac(self, sequence: int, body: bytes) -> bytes:
        return _mac(self._key, f"down\n{sequence}", body)


def _proof_parts(proof: str | None) -> tuple[str, str] | None:
    if not proof or len(proof) > _MAX_PROOF_CHARS:
        return None
    parts = proof.split(".")
    return (parts[1], parts[2]) if len(parts) == 3 and parts[0] == VERSION else None


class CallerSeal:
    """The caller's side of one call: its metadata, and checks of everything that comes back."""

    def __init__(self, key: bytes, identity: Identity, method: str, body: bytes, now: float) -> None:
        self._key = key
        self._method = method
        self.token = make_token(key, identity, method, body, now)
        self.metadata = ((TOKEN_KEY, self.token),)
        self._session: SessionKeys | None = None
        self._received = 0

    def _good(self, proof: str | None, expected: Callable[[SessionKeys], str]) -> bool:
        """Whether `proof` is what the answering side sends, under the nonce it named first (the
        call's session is bound to the first nonce that proves good: one call, one nonce)."""
        parts = _proof_parts(proof)
        if parts is None or proof is None:
            return False
        keys = self._session
        if keys is None:
            keys = SessionKeys(self._key, self._method, self.token, parts[0])
        elif keys.nonce != parts[0]:
            return False
        if not hmac.compare_digest(expected(keys), proof):
            return False
        self._session = keys
        return True

    def opened(self, proof: str | None) -> bool:
        """Whether a stream's opening proves the answering side holds our key."""
        return self._good(proof, SessionKeys.opening)

    def answered(self, proof: str | None, body: bytes) -> bool:
        """Whether a single answer with `body` is the one the answering side sent us."""
        return self._good(proof, lambda keys: keys.answer(body))

    def refused(self, proof: str | None, code: str, details: str) -> bool:
        """Whether a refusal with `code` and `details` comes from the answering side as it is."""
        return self._good(proof, lambda keys: keys.refusal(code, details))

    def message(self, message: Any) -> str | None:
        """Check a streamed message's seal (it must be the next one, in order): None when good,
        else why not. The seal is removed from `message`."""
        if self._session is None:
            return "a message came before the stream's proof"
        if not message.HasField("seal"):
            return "a message carries no seal"
        sequence, mac = message.seal.sequence, message.seal.mac
        message.ClearField("seal")
        if sequence != self._received + 1:
            return (
                f"message {sequence} came where message {self._received + 1} was due (replayed, reordered or dropped)"
            )
        if not hmac.compare_digest(self._session.message_mac(sequence, body_of(message)), mac):
            return f"message {sequence} does not carry this session's MAC (changed or inserted on the way)"
        self._received = sequence
        return None


@dataclass
class Admission:
    """A call whose token is good: who made it, its series and number, and the keys of its answers."""

    identity: Identity
    series: str
    number: int
    keys: SessionKeys
    sent: int = 0  # streamed messages sealed so far

    def seal(self, message: Any) -> Any:
        """Put the next seal on a message about to be streamed (it must have a `seal` field)."""
        message.ClearField("seal")
        self.sent += 1
        mac = self.keys.message_mac(self.sent, body_of(message))
        message.seal.sequence = self.sent
        message.seal.mac = mac
        return message


class Gate:
    """The answering side: checks tokens against keys derived on demand (`key_of(identity)`)."""

    def __init__(self, key_of: Callable[[Identity], bytes], identity_problem: Callable[[Identity], str | None],
                 window_s: float = TOKEN_WINDOW_S, max_callers: int = MAX_CALLERS) -> None:
        """`identity_problem(identity)`: why a named identity cannot be one of ours (a bad host
        name), checked before any key is derived for it."""
        self._key_of = key_of
        self._identity_problem = identity_problem
        self._keys: dict[Identity, bytes] = {}  # identities checked, with their keys
        self.window_s = window_s
        self.replays = Replays(window_s, max_callers)

    def check(self, method: str, token: str | None, body: bytes, now: float) -> tuple[Admission | None, str]:
        """(admission, "") for a token that proves its caller's key over this very request;
        (None, why) otherwise. The call's number is not yet taken: see `admit`."""
        if not token:
            return None, "the call carries no job token (is the caller part of this job? give it its key)"
        if len(token) > _MAX_TOKEN_CHARS:
            return None, "its job token is too long"
        parts = token.split("|")
        if len(parts) != 6 or parts[0] != VERSION:  # v2, identity, stamp, series, number, mac
            return None, "its job token is malformed"
        identity_text, stamp, series, number_text, mac = parts[1:]
        identity = Identity.parse(identity_text)
        if identity is None:
            return None, "the call names no identity a job part has (agent HOST or worker HOST ID)"
        key = self._keys.get(identity)
        if key is None:
            problem = self._identity_problem(identity)
            if problem:
                return None, f"the call's identity is not one of ours: {problem}"
            if len(self._keys) >= MAX_KEPT_KEYS:
                self._keys.clear()
            key = self._keys[identity] = self._key_of(identity)
        if not (number_text.isascii() and number_text.isdigit() and len(number_text) <= 19 and 0 < len(series) <= 32):
            return None, "its job token is malformed"
        try:
            when, number = float(stamp), int(number_text)
        except ValueError:
            return None, "its job token is malformed"
        expected = _mac(key, _call_head(method, identity_text, stamp, series, number), body).hex()
        if not hmac.compare_digest(expected, mac):
            return None, f"its token does not prove the key of {identity} over this request"
        if abs(now - when) > self.window_s:
            return (
                None,
                f"its job token is {abs(now - when):.0f} s from this host's clock (more than {self.window_s:g} s)",
            )
        return Admission(identity, series, number, SessionKeys(key, method, token, secrets.token_hex(8))), ""

    def admit(self, admission: Admission, now: float) -> str | None:
        """Take the call's number (once the call is allowed): None, or why it is refused."""
        return self.replays.accept(f"{admission.identity.header()} {admission.series}", admission.number, now)


class Replays:
    """Per caller (an identity's series of calls): the highest number seen and a bit for each of
    the `slack` numbers below it.

    A caller is forgotten `2 * window_s` after its last call: any token of its that could still
    pass the timestamp check was accepted within that time, so it is still remembered."""

    def __init__(self, window_s: float, max_callers: int = MAX_CALLERS, slack: int = REPLAY_SLACK) -> None:
        self._keep_s = 2 * window_s
        self._max = max_callers
        self._slack = slack
        self._full_mask = (1 << slack) - 1
        self._callers: OrderedDict[str, list] = OrderedDict()  # caller -> [highest, mask, last seen]

    def __len__(self) -> int:
        return len(self._callers)

    def accept(self, caller: str, counter: int, now: float) -> str | None:
        self._forget(now)
        entry = self._callers.get(caller)
        if entry is None:
            if len(self._callers) >= self._max:
                return f"{self._max} callers are remembered already (refused until older ones expire)"
            self._callers[caller] = [counter, 1, now]
            return None
        highest, mask, _ = entry
        if counter > highest:
            shift = counter - highest
            entry[0], entry[1] = counter, ((mask << shift) | 1) & self._full_mask if shift < self._slack else 1
        else:
            behind = highest - counter
            if behind >= self._slack:
                return (
                    f"its number is {behind} calls behind this caller's newest (a replay, or a caller far out of order)"
                )
            bit = 1 << behind
            if mask & bit:
                return "its job token was used before (a replayed call)"
            entry[1] = mask | bit
        entry[2] = now
        self._callers.move_to_end(caller)
        return None

    def _forget(self, now: float) -> None:
        callers = self._callers
        while callers:
            first = next(iter(callers.values()))
            if now - first[2] <= self._keep_s:
                return
            callers.popitem(last=False)
