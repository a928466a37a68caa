"""A worker's environment as its agent starts it: the agent's own, the rendezvous' variables for
it, glibc's heap settings (`starting/heap.py`) and its own key (none for a spare until it
becomes a worker). Never the job secret nor the agent's key."""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from ringmaster.common.keys import WORKER_KEY_ENV, worker_key
from ringmaster.common.reconnect import parse_addresses
from ringmaster.common.secret import SECRET_ENV
from ringmaster.common.tls import TLS_CA_ENV
from ringmaster.proto import environment as env_names
from ringmaster.worker.agent.starting.heap import heap_settings
from ringmaster.worker.agent.starting.threads import SHARED_MACHINE_ENV


def worker_environment(spec_env: Mapping[str, str], worker_id: str | None, agent_key: bytes | None, stops_dir: str,
                       beats_folder: str, ca_pem: bytes | None, addresses: Sequence[str]) -> dict[str, str]:
    """`stops_dir`: where the agent marks a worker before its SIGTERM (host_signals.py);
    `beats_folder`: where a large job's workers send their beats ("" where none); `addresses`:
    the rendezvous this agent can reach (a standby included)."""
    env = _inherited({**os.environ, **spec_env})
    if agent_key is not None and worker_id is not None:
        env[WORKER_KEY_ENV] = worker_key(agent_key, worker_id).hex()
    env[env_names.AGENT_STOPS] = stops_dir
    env[env_names.AGENT_PID] = str(os.getpid())
    if beats_folder:
        env[env_names.AGENT_BEATS] = beats_folder
    else:
        env.pop(env_names.AGENT_BEATS, None)
    env.pop(TLS_CA_ENV, None)
    if ca_pem is not None:
        env[TLS_CA_ENV] = ca_pem.decode()
    # Workers reach the rendezvous wherever this agent can (a standby included).
    known = parse_addresses(env.get(env_names.RENDEZVOUS, "")) + list(addresses)
    env[env_names.RENDEZVOUS] = ",".join(dict.fromkeys(known))
    return env


def ahead_environment() -> dict[str, str]:
    """What a spare warmed before its agent knows the job starts with (`daemon.warm_ahead`): a
    worker's environment less its job's and its own variables, which a spare takes on when it
    becomes the worker (`spare_pool.spare_assignment` compares the rest: the heap's settings too)."""
    return _inherited(dict(os.environ))


def _inherited(env: dict[str, str]) -> dict[str, str]:
    """`env` (the agent's own, the job's over it) as any process the agent starts for a worker
    inherits it, a spare warmed ahead included: one rule for both, or a spare would not fit its
    worker. The heap's settings added (a worker's C heap keeps what it frees, unless its user
    chose: heap.py); the job secret, the agent's machine-sharing hint and any worker key taken out."""
    env.update(heap_settings(env))
    env.pop(SECRET_ENV, None)
    env.pop(SHARED_MACHINE_ENV, None)  # the agent's to read (starting/threads.py), not the worker's
    env.pop(WORKER_KEY_ENV, None)  # the worker's key is the agent's to derive, not the rendezvous' to send
    return env
