"""The job secret: where it comes from (a file, the environment, made anew) and what makes one usable.

The secret is the rendezvous' and its owner's (the control API asks for it); the parts on hosts
hold keys derived from it (`keys`), and every gRPC call proves one of those (`seal`). The secret
itself never travels on the wire.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import stat

from ringmaster.common.errors import UsageError

#: Environment variable that hands the secret to `serve`, `agent` and the CLI (never a command-line argument).
SECRET_ENV = "RINGMASTER_SECRET"
#: Fewest characters a secret has (a generated one has 64 hex digits).
MIN_SECRET_CHARS = 16
#: Most characters read from a secret file or the environment.
MAX_SECRET_CHARS = 4096


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
        raise SecretError(f"the job secret in {origin} has {len(value)} characters; it needs at least "
                          f"{MIN_SECRET_CHARS} (make one with: python -c 'import secrets; "
                          "print(secrets.token_hex(32))')")
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
    return check_secret(read_private_file(file, "--secret-file"), f"--secret-file {file}")


def read_private_file(path: str | os.PathLike[str], flag: str, limit: int = MAX_SECRET_CHARS + 2) -> str:
    """The text of a file that holds a secret or a key, at most `limit` bytes; SecretError when it
    cannot be read or when other users could read it too (mode 600 is asked for, as ssh does)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit)
            mode = os.fstat(f.fileno()).st_mode
    except OSError as exc:
        raise SecretError(f"cannot read {flag} {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretError(f"{flag} {path} can be read by other users (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    return raw.decode(errors="replace")


def secret_from(secret_file: str | None, environ: dict[str, str] | os._Environ[str],
                create: bool = False) -> str | None:
    """The secret from `--secret-file` (first) or `$RINGMASTER_SECRET`; None when neither is given."""
    if secret_file:
        return read_secret_file(secret_file, create)
    if environ.get(SECRET_ENV):
        return check_secret(environ[SECRET_ENV], f"${SECRET_ENV}")
    return None
