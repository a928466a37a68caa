"""One key per part of a job, derived from the job secret, so that holding one proves one role.

The job secret is the rendezvous' (and its owner's, for the control API). What runs on hosts
never needs it:
- the agent of host H holds `agent_key(secret, H)`, handed to it by whoever launched it (or
  derived by `ringmaster agent` from a secret file, which it then forgets);
- worker W on host H holds `worker_key(agent_key(secret, H), W)`: its agent derives it while
  starting the worker, so no worker key ever travels on the wire, and a training script (and
  anything it starts) holds its own key only.

The rendezvous derives every key from the secret, so it needs no table of keys. A key proves
an identity (`Identity`); what an identity may ask for (its own host, its own worker) is
checked by the service that answers. Pure: bytes and strings in, keys out.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

#: Environment variable holding a worker's own key (hex), set by its agent.
WORKER_KEY_ENV = "RINGMASTER_WORKER_KEY"
#: Characters of a key written as hex (32 bytes).
KEY_HEX_CHARS = 64
AGENT = "agent"
WORKER = "worker"
#: Longest worker id (a host name of at most 253 characters, '/', a number).
MAX_WORKER_ID_CHARS = 270


@dataclass(frozen=True)
class Identity:
    """Who a caller says it is: the agent of `host`, or worker `worker` on `host`."""

    role: str
    host: str
    worker: str = ""

    def header(self) -> str:
        """As it travels in a call's metadata: `agent HOST` or `worker HOST WORKER`."""
        return f"{self.role} {self.host}" if self.role == AGENT else f"{self.role} {self.host} {self.worker}"

    @classmethod
    def parse(cls, text: str | None) -> "Identity | None":
        """The identity a header names, or None when it names none (names are checked by the caller)."""
        if not text or len(text) > 2 * MAX_WORKER_ID_CHARS:
            return None
        role, _, rest = text.partition(" ")
        if role == AGENT and rest:
            return cls(AGENT, rest)  # whatever it is: the host-name rule judges it
        parts = rest.split(" ")
        if role == WORKER and len(parts) == 2 and parts[0] and parts[1]:
            return cls(WORKER, parts[0], parts[1])
        return None

    def __str__(self) -> str:
        return f"the agent of {self.host}" if self.role == AGENT else f"worker {self.worker}"


def _derive(key: bytes, label: str, name: str) -> bytes:
    return hmac.new(key, f"ringmaster {label} key\n{name}".encode(), hashlib.sha256).digest()


def agent_key(secret: str, host: str) -> bytes:
    """The key of host `host`'s agent."""
    return _derive(secret.encode(), AGENT, host)


def pool_host_key(join_secret: str, host: str) -> bytes:
    """The key with which host `host`'s pool agent (`ringmaster pool agent`) joins a pool: derived
    from the pool's join secret, so one host's key does not let it speak for another host."""
    return _derive(join_secret.encode(), "pool-host", host)


def worker_key(host_agent_key: bytes, worker_id: str) -> bytes:
    """The key of worker `worker_id`, from the key of the agent of its host."""
    return _derive(host_agent_key, WORKER, worker_id)


def key_of(secret: str, identity: Identity) -> bytes:
    """The key `identity` must prove (the rendezvous' side: it holds the secret)."""
    host_key = agent_key(secret, identity.host)
    return host_key if identity.role == AGENT else worker_key(host_key, identity.worker)


def parse_key(text: str, origin: str) -> bytes:
    """A key written as hex; ValueError naming `origin` when it is not one."""
    value = text.strip()
    if len(value) != KEY_HEX_CHARS:
        raise ValueError(f"the key in {origin} has {len(value)} characters; a key is {KEY_HEX_CHARS} hex digits")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"the key in {origin} is not hex") from None
