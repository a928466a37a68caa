"""How often agents and workers heartbeat, stretched with the job's size.

Every heartbeat costs the rendezvous a call (its authentication, a coordinator input), about
half a millisecond of its one Python process; at the configured interval (1 s) 32,768 workers
would need 15 CPU-seconds a second, and a rendezvous that cannot keep up declares healthy
workers dead. So all agents' heartbeats together are held to `AGENT_BEATS_PER_S` and all workers'
to `WORKER_BEATS_PER_S`: each caller's interval is its share (never below the configured one,
never above `MOST_INTERVAL_S`), and the silence that counts as death stretches by the same
factor. A job of up to a few hundred hosts keeps the configured interval.

What the stretch does not slow down: a process or host that dies closes its session's
connection, which the rendezvous notices at once; heartbeats find only the hung and the
silently cut off. The interval travels in each heartbeat's answer (`Ack.heartbeat_interval_s`).

Past `WORKER_BEATS_PER_S` workers (or always, with `--heartbeat-relay always`) the workers' beats
are *relayed*: each worker sends its heartbeat to its host's agent, which carries the latest of
each in its own heartbeat (`Ack.relay_beats`): the host's workers cost the rendezvous one call
per agent interval, and a worker is heard as often as its agent (its silence counts from the
last beat its agent received, so the timeout is the agent's plus one worker interval).
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringmaster.common.heartbeats import paced_interval

#: Heartbeats a second the rendezvous takes from all agents together ...
AGENT_BEATS_PER_S = 250.0
#: ... and from all workers together.
WORKER_BEATS_PER_S = 1000.0


@dataclass(frozen=True)
class Pace:
    """The intervals asked of agents and workers now, and the silence after which each is dead."""

    agent_s: float
    worker_s: float
    agent_timeout_s: float
    worker_timeout_s: float
    relay: bool = False  # workers' beats go through their agents (see the module's docstring)


def pace(interval_s: float, timeout_s: float, hosts: int, workers: int, relay: str = "auto") -> Pace:
    """The pace for `hosts` agents and `workers` workers, from the configured heartbeat interval
    and timeout (`--heartbeat-interval`, `--heartbeat-timeout`) and `--heartbeat-relay`
    ("auto": when the workers' own beats would have to stretch; "always"; "never")."""
    agent = paced_interval(hosts / AGENT_BEATS_PER_S, interval_s)  # (each caller's share, bounded as callers bound it)
    worker = paced_interval(workers / WORKER_BEATS_PER_S, interval_s)
    agent_timeout, worker_timeout = timeout_s * agent / interval_s, timeout_s * worker / interval_s
    relayed = relay == "always" or (relay == "auto" and worker > interval_s)
    if relayed:  # (a worker that still beats itself keeps its paced interval: the longer timeout holds for both)
        worker_timeout = max(worker_timeout, agent_timeout + interval_s)
    return Pace(agent, worker, agent_timeout, worker_timeout, relayed)
