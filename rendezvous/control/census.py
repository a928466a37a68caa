"""What a pass over the job asks of its workers, gathered in one look and kept while no record
changes.

A pass (`Formation.reconcile`, the quiet inputs after it, the agents each host should run) asked
the same questions of every worker a dozen times: the generation's members, the live workers, the
workers running on each host, the hosts that run any, the workers waiting to join. At 4,096 x 8
each question was a walk through 32,768 workers, and together they were most of a pass (0.11 s,
and a change makes several). The answers depend only on the records, so they are computed
together once and kept until a record changes (`records.recorded_changes`), a worker is added,
or a generation forms. The lists are shared: callers read them and never change them.

A change of a few workers' records (a batch of `Ready`s, newcomers connecting, a host's workers
leaving) brings the census up to date from those workers alone (`updated_census`), the
workers having said what changed (`JobWorkers.take_census_changed`): a whole look took 15-19 ms
at 4,096 x 8, and a growth took a dozen. What may change between two looks is narrow: a worker
never comes back to life nor stops being stopped, so the live and running lists only lose
workers; only the joining list gains any, placed where a whole look puts them.
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
    #: Live workers being stopped.
    leaving: list[Worker]


def take_census(workers: JobWorkers, generation: Generation | None) -> Census:
    """One look at every worker (see the module's docstring)."""
    member_set = generation.member_set if generation is not None else frozenset()
    # (comprehensions, each a tight loop: a third quicker than one loop doing it all)
    live = [w for w in workers.values() if w.live]
    leaving = [w for w in live if w.stopping]
    running: dict[str, list[Worker]] = {}
    for host, placed in workers.hosts():
        on = [w for w in placed if w.live and not w.stopping]
        if on:
            running[host] = on
    joining = [w for w in live if w.phase is not Phase.MEMBER and _joins(w, member_set)]
    members = [workers[i] for i in generation.member_ids] if generation is not None else []
    return Census(members, live, running, frozenset(running.keys() | {w.host for w in leaving}), joining, leaving)


#: A census is brought up to date from the workers changed while they are fewer than a
#: 1/UPDATED_AT_MOST part of the job; past that a whole look costs less (a host's workers are
#: looked at again for each host that has a changed one).
UPDATED_AT_MOST = 8


def _joins(w: Worker, member_set: frozenset[str]) -> bool:
    """Whether live worker `w` waits to join (`Census.joining`)."""
    phase = w.phase
    return not w.stopping and (phase is Phase.SPAWNING or phase is Phase.WARMING
                               or (phase is Phase.READY and w.worker_id not in member_set))


def updated_census(census: Census, changed: list[Worker], workers: JobWorkers,
                   generation: Generation | None) -> Census:
    """`census` brought up to date for the `changed` workers' records, where no worker was set
    or deleted and the generation is the same since it was taken: what `take_census` answers now."""
    changed = [w for w in changed if workers.get(w.worker_id) is w]  # (a replaced one's record is no news)
    if not changed:
        return census
    member_set = generation.member_set if generation is not None else frozenset()
    live = census.live
    if any(not w.live for w in changed):
        live = [w for w in live if w.live]  # (only lost: nothing comes back to life)
    running = census.running
    busy = census.busy_hosts
    for host in {w.host for w in changed}:
        placed = workers.on(host)
        on = [w for w in placed if w.live and not w.stopping]
        if on != running.get(host, []):
            if running is census.running:
                running = dict(running)
            if on:
                running[host] = on
            else:
                del running[host]  # (the others keep their order)
        if host in busy and not any(w.live for w in placed):
            busy = busy - {host}
    moved = {id(w) for w in changed}
    joining = [w for w in census.joining if id(w) not in moved]
    entering = [w for w in changed if w.live and _joins(w, member_set)]
    if entering:
        joining = sorted(joining + entering, key=workers.position)
    elif len(joining) == len(census.joining):
        joining = census.joining
    leaving = census.leaving
    if leaving or any(w.live and w.stopping for w in changed):
        leaving = [w for w in live if w.stopping]  # (a look at every worker only while some leave)
    return Census(census.members, live, running, busy, joining, leaving)


class CensusKeeper:
    """The census of the job as it is now: taken again once a worker was set or deleted, or
    another generation is current; brought up to date from the workers changed once a record
    changed. `job()` returns the workers and the generation."""

    def __init__(self, job: Callable[[], tuple[JobWorkers, Generation | None]]) -> None:
        self._job = job
        self._key: tuple[int, int, JobWorkers, Generation | None] | None = None
        self._census: Census | None = None

    def now(self) -> Census:
        workers, generation = self._job()
        key = self._key
        changes, version = recorded_changes(), workers.version
        census = self._census
        if census is not None and key is not None and key[1] == version and key[2] is workers \
                and key[3] is generation:  # (no worker set or deleted, the same generation)
            if key[0] == changes:
                return census
            changed = workers.take_census_changed()
            census = updated_census(census, changed, workers, generation) \
                if len(changed) * UPDATED_AT_MOST < len(workers) else take_census(workers, generation)
        else:
            workers.take_census_changed()  # (what the whole look sees)
            census = take_census(workers, generation)
        self._census = census
        self._key = (changes, version, workers, generation)
        return census
