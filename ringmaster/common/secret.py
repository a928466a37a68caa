"""The job secret: what every part of one job shares, and how a call proves it knows it.

Every gRPC call carries a token in its metadata: an HMAC-SHA256, under the secret, of the
method, a timestamp and a fresh nonce. The secret itself never travels, so a listener on the
network learns nothing it can reuse: a token is good for one method, for `TOKEN_WINDOW_S`
around its timestamp, and once (the receiver remembers the nonces it has seen in the window).
The answer carries a proof (the HMAC of the caller's nonce under the same secret, with another
label), so a caller also knows it reached the job's own rendezvous, not something posing as it.

This module is pure: bytes and strings in, verdicts out. `grpc_auth` puts it on the wire.
Confidentiality of what the calls carry (command lines, environments) is TLS's job.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pathlib
import secrets
import stat
from collections import OrderedDict

from ringmaster.common.errors import UsageError

#: Environment variable that hands the secret to agents and workers (never a command-line argument).
SECRET_ENV = "RINGMASTER_SECRET"
#: Fewest characters a secret has (a generated one has 64 hex digits).
MIN_SECRET_CHARS = 16
#: Most characters read from a secret file or the environment.
MAX_SECRET_CHARS = 4096
#: Seconds a token is good for on either side of its timestamp (clock skew between hosts included).
TOKEN_WINDOW_S = 300.0
#: Nonces remembered at most (older ones beyond this are forgotten first; their tokens expire anyway).
MAX_REMEMBERED_NONCES = 100_000
#: Metadata key of the caller's token and of the answer's proof.
TOKEN_KEY = "ringmaster-auth"
PROOF_KEY = "ringmaster-proof"
_VERSION = "v1"
_MAX_TOKEN_CHARS = 256


class SecretError(UsageError):
    """A job secret that cannot be used (missing, too short, unreadable); the message says how to give one."""


def generate_secret() -> str:
    """A fresh secret: 256 random bits as hex."""
    return secrets.token_hex(32)


def check_secret(text: str, origin: str) -> str:
    """`text` stripped, if it can serve as a secret; `SecretError` naming `origin` otherwise."""
    value = text.strip()
    if len(value) > MAX_SECRET_CHARS:
        raise SecretError(f"the job secret in {origin} is longer than {MAX_SECRET_CHARS} characters")
    if len(value) < MIN_SECRET_CHARS:
        raise SecretError(f"the job secret in {origin} has {len(value)} characters; it needs at least {MIN_SECRET_CHARS} "
                          "(make one with: python -c 'import secrets; print(secrets.token_hex(32))')")
    if not value.isprintable():
        raise SecretError(f"the job secret in {origin} holds unprintable characters")
    return value


def read_secret_file(path: str | os.PathLike[str], create: bool = False) -> str:
    """The secret in `path`. With `create`, a missing file is made (mode 0600) with a new secret,
    so `ringmaster run --secret-file F` can be followed by `ringmaster scale --secret-file F`."""
    file = pathlib.Path(path)
    if create and not file.exists():
        value = generate_secret()
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        return value
    try:
        with open(file, "rb") as f:
            raw = f.read(MAX_SECRET_CHARS + 2)
        mode = file.stat().st_mode
    except OSError as exc:
        raise SecretError(f"cannot read the job secret from --secret-file {file}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretError(f"--secret-file {file} can be read by other users (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    return check_secret(raw.decode(errors="replace"), f"--secret-file {file}")


def secret_from(secret_file: str | None, environ: dict[str, str] | os._Environ[str], create: bool = False) -> str | None:
    """The secret from `--secret-file` (first) or `$RINGMASTER_SECRET`; None when neither is given."""
    if secret_file:
        return read_secret_file(secret_file, create)
    if environ.get(SECRET_ENV):
        return check_secret(environ[SECRET_ENV], f"${SECRET_ENV}")
    return None


def _mac(secret: str, *parts: str) -> str:
    return hmac.new(secret.encode(), "\n".join(parts).encode(), hashlib.sha256).hexdigest()


def make_token(secret: str, method: str, now: float, nonce: str | None = None) -> tuple[str, str]:
    """(token, nonce) for a call of `method` at `now` (seconds since the epoch)."""
    nonce = nonce or secrets.token_hex(12)
    stamp = f"{now:.3f}"
    return f"{_VERSION}.{stamp}.{nonce}.{_mac(secret, 'call', method, stamp, nonce)}", nonce


def make_proof(secret: str, nonce: str) -> str:
    """What the rendezvous answers to a call whose token had `nonce`."""
    return _mac(secret, "answer", nonce)


def proof_is_good(secret: str, nonce: str, proof: str | None) -> bool:
    return proof is not None and hmac.compare_digest(make_proof(secret, nonce), proof)


class TokenChecker:
    """Checks callers' tokens for one secret and remembers nonces, so no token works twice."""

    def __init__(self, secret: str, window_s: float = TOKEN_WINDOW_S, max_nonces: int = MAX_REMEMBERED_NONCES) -> None:
        self._secret = secret
        self.window_s = window_s
        self._max = max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> its token's timestamp

    def check(self, method: str, token: str | None, now: float) -> tuple[str | None, str]:
        """(nonce, "") when `token` is good for `method` at `now`; (None, why) otherwise."""
        if not token:
            return None, "the call carries no job token (is the caller part of this job? give it the job secret)"
        if len(token) > _MAX_TOKEN_CHARS:
            return None, "its job token is too long"
        parts = token.split(".")
        if len(parts) != 5 or parts[0] != _VERSION:  # v1, seconds, fraction, nonce, mac
            return None, "its job token is malformed"
        stamp, nonce, mac = f"{parts[1]}.{parts[2]}", parts[3], parts[4]
        try:
            when = float(stamp)
        except ValueError:
            return None, "its job token is malformed"
        if not hmac.compare_digest(_mac(self._secret, "call", method, stamp, nonce), mac):
            return None, "its job token is not signed with this job's secret"
        if abs(now - when) > self.window_s:
            return None, f"its job token is {abs(now - when):.0f} s from this host's clock (more than {self.window_s:g} s)"
        self._forget(now)
        if nonce in self._seen:
            return None, "its job token was used before (a replayed call)"
        self._seen[nonce] = when
        return nonce, ""

    def _forget(self, now: float) -> None:
        while self._seen:
            nonce, when = next(iter(self._seen.items()))
            if len(self._seen) < self._max and now - when <= self.window_s:
                return
            self._seen.popitem(last=False)
