"""What `ringmaster run` hands an agent on its stdin: the key of the agent's host (never the job
secret) and the launching environment, as one JSON line (never on a command line, where `ps`
shows it, nor in the agent's environment, which its workers could read in /proc)."""

from __future__ import annotations

import json
from typing import Mapping


def handover(key_hex: str, environ: Mapping[str, str], rendezvous: str | None = None) -> bytes:
    """The one line written to an agent's stdin (with `rendezvous` for an agent started before
    its job was known: `--await-order`)."""
    line = {"key": key_hex, "env": dict(environ)}
    if rendezvous is not None:
        line["rendezvous"] = rendezvous
    return (json.dumps(line) + "\n").encode()


def handed_rendezvous(line: bytes) -> str | None:
    """The rendezvous a handover names, if it names one (after `read_handover` accepted it)."""
    raw = json.loads(line)
    value = raw.get("rendezvous") if isinstance(raw, dict) else None
    return value if isinstance(value, str) and 0 < len(value) <= 1000 else None


#: Longest handover line an agent reads (the environment included).
MAX_HANDOVER_BYTES = 1 << 20


def read_handover(line: bytes) -> tuple[str, dict[str, str]]:
    """(the host's key as hex, environment) from a handover line; ValueError saying what is wrong."""
    if len(line) > MAX_HANDOVER_BYTES:
        raise ValueError(f"the launcher's handover is over {MAX_HANDOVER_BYTES} bytes")
    try:
        raw = json.loads(line)
    except ValueError:
        raise ValueError("the launcher's handover on stdin is not JSON (start the agent with --from-launcher only "
                         "from `ringmaster run`)") from None
    key, env = (raw.get("key"), raw.get("env")) if isinstance(raw, dict) else (None, None)
    if not isinstance(key, str) or not isinstance(env, dict) or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the launcher's handover lacks a key or an environment of strings")
    return key, env
