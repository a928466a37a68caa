"""What a pass over the job asks of its workers, gathered in one look and kept while no record
changes.

A pass (`Formation.reconcile`, the quiet inputs after it, the agents each host should run) asked
the same questions of every worker a dozen times: the generation's members, the live workers, the
workers running on each host, the hosts that run any, the workers waiting to join. At 4,096 x 8
each question was a walk through 32,768 workers, and together they were most of a pass (0.11 s,
and a change makes several). The answers depend only on the records, so they are computed
together once and kept until a record changes (`records.recorded_changes`), a worker is added,
or a generation forms. The lists are shared: callers read them and never change them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ringmaster.rendezvous.control.records import Generation, JobWorkers, Phase, Worker, recorded_changes


@dataclass(frozen=True)
class Census:
    #: The current generation's members in rank order (none without a generation).
    members: list[Worker]
    #: Workers not exited nor counted as failed, in the order they were added.
    live: list[Worker]
    #: Live workers not being stopped, by host.
    running: dict[str, list[Worker]]
    #: Hosts that run a live worker (being stopped or not).
    busy_hosts: frozenset[str]
    #: Live workers not being stopped that wait to join a generation: started or warming up (a
    #: planned generation's members too, until they connect), or ready outside the generation.
    joining: list[Worker]


def take_census(workers: JobWorkers, generation: Generation | None,
                members: list[Worker] | None = None) -> Census:
    """One look at every worker (see the module's docstring); `members`: the generation's, where
    the caller kept them (they change only with the generation, or a worker set again)."""
    member_set = generation.member_set if generation is not None else frozenset()
    # (comprehensions, each a tight loop: a third quicker than one loop doing it all)
    live = [w for w in workers.values() if w.live]
    leaving = [w for w in live if w.stopping]
    running: dict[str, list[Worker]] = {}
    for host, placed in workers.hosts():
        on = [w for w in placed if w.live and not w.stopping]
        if on:
            running[host] = on
    spawning, warming, ready = Phase.SPAWNING, Phase.WARMING, Phase.READY
    joining = [w for w in live if w.phase is not Phase.MEMBER and not w.stopping and (
        w.phase is spawning or w.phase is warming or (w.phase is ready and w.worker_id not in member_set))]
    if members is None:
        members = [workers[i] for i in generation.member_ids] if generation is not None else []
    return Census(members, live, running, frozenset(running.keys() | {w.host for w in leaving}), joining)


class CensusKeeper:
    """The census of the job as it is now: taken again only once a record changed, a worker was
    added, or another generation is current. `job()` returns the workers and the generation."""

    def __init__(self, job: Callable[[], tuple[JobWorkers, Generation | None]]) -> None:
        self._job = job
        self._key: tuple[int, int, JobWorkers, Generation | None] | None = None
        self._census: Census | None = None

    def now(self) -> Census:
        workers, generation = self._job()
        key = self._key
        changes, version = recorded_changes(), workers.version
        if (self._census is None or key is None or key[0] != changes or key[1] != version or key[2] is not workers
                or key[3] is not generation):
            same_members = key is not None and key[1] == version and key[2] is workers and key[3] is generation
            members = self._census.members if same_members and self._census is not None else None
            self._census = take_census(workers, generation, members)
            self._key = (changes, version, workers, generation)
        return self._census
