"""Where each job's workers go, given its target size: as few hosts as possible (fewer links
between hosts in its rings), ties broken toward the emptiest host (load evened out), and a
running job's workers never moved without cause.

A job that shrinks gives back slots on the hosts where it has the fewest first (it leaves whole
hosts, and keeps its densest ones); a job that grows first fills the free slots of hosts it is
already on, then takes the hosts with the most free slots (the fewest hosts for the slots it
needs), and the last few go to the host they fill best (a job of 6 on hosts of 4 takes one
empty host and two slots of a busy one, not two empty hosts). A job that is resized (it pauses
at a commit anyway, and new workers start) whose workers would span more hosts than a fresh
packing needs is packed again: elastic jobs resized over hours would otherwise end up on many half-used hosts, their
rings crossing hosts they need not (a job shrunk from 9 workers on 7 hosts to 4 stayed on two
hosts for the rest of its run, half as fast as on one). A job the caller names in `repack` is
packed again at the size it has too (the caller judged that fewer hosts pay for the pause). Workers on hosts that are
gone (failed, blacklisted, drained) are simply not kept. Where workers ask for GPUs or CPUs besides their slot, a host
takes as many as all of them fit, and two jobs that use GPUs never share a host (each numbers the GPUs it sees from 0).
A job of replica groups (`--group-size K`) takes whole groups of a host's slots where it can (hosts of 3
slots hold a job of 4 in groups of 2 as 2 + 2, not 3 + 1: a group split over two hosts sends
its FSDP2 all-gathers between them), and splits a group only where no host has room for one.
Pure: hosts' slots (and resources), current placements and target sizes in; placements out.
"""

from __future__ import annotations

from typing import Collection, Mapping

from ringmaster.rendezvous.scheduling.resources import GPU, SLOTS, Demand, room_in, usage

Placement = dict[str, int]


def _shrink(current: Mapping[str, int], size: int) -> Placement:
    kept = dict(current)
    surplus = sum(kept.values()) - size
    for host in sorted(kept, key=lambda h: (kept[h], h), reverse=False):
        if surplus <= 0:
            break
        take = min(kept[host], surplus)
        kept[host] -= take
        surplus -= take
    return {h: n for h, n in kept.items() if n > 0}


def place(hosts: Mapping[str, int], current: Mapping[str, Mapping[str, int]], sizes: Mapping[str, int],
          order: list[str], demand: Mapping[str, Demand] | None = None,
          resources: Mapping[str, Mapping[str, float]] | None = None,
          repack: Collection[str] = (), groups: Mapping[str, int] | None = None) -> dict[str, Placement]:
    """Each job's placement. `hosts`: usable hosts and their slots; `current`: where jobs run now;
    `sizes`: target sizes (their sum at most the slots); `order`: jobs in the order they are
    placed (precedence); `demand`: what a job's worker takes besides its slot, out of each host's
    `resources`. On slots alone every size is placed; where workers ask for other resources a
    job may be placed short of its size (they do not fit together), which the caller judges.
    `groups`: a job's workers per replica group (1 where not named)."""
    if sum(sizes.values()) > sum(hosts.values()):
        raise ValueError(f"sizes {dict(sizes)} need more than the pool's {sum(hosts.values())} slots")
    placer = _Placer(hosts, demand or {}, resources or {}, groups or {})
    for job in order:  # first, what every job keeps
        usable = {h: n for h, n in current.get(job, {}).items() if h in hosts}
        size = sizes.get(job, 0)
        placer.result[job] = _shrink(usable, size) if sum(usable.values()) >= size else usable
        for host, n in placer.result[job].items():
            placer.take(job, host, n)
    placer.leave_overfull_hosts(order)
    for job in order:  # then growth, and a resized job spread wider than it need be packed again
        size = sizes.get(job, 0)
        placement = placer.result[job]
        before = {h: n for h, n in current.get(job, {}).items() if h in hosts}
        if sum(placement.values()) < size:
            placer.grow(job, placement, size - sum(placement.values()))
        if not before or (sum(before.values()) == size and job not in repack) or len(placement) <= 1:
            continue  # not resized (or new, or on one host): its workers stay where they are
        placer.pack(job, size)
    return placer.result


class _Placer:
    """The free slots and resources of each host as jobs are placed on them (`place`)."""

    def __init__(self, hosts: Mapping[str, int], demand: Mapping[str, Demand],
                 resources: Mapping[str, Mapping[str, float]], groups: Mapping[str, int]) -> None:
        self.hosts, self.demand, self.groups = hosts, demand, groups
        self.free = {h: {SLOTS: float(n), **resources.get(h, {})} for h, n in hosts.items()}
        self.result: dict[str, Placement] = {}

    def take(self, job: str, host: str, workers: int) -> None:
        for name, amount in usage(self.demand.get(job, {}), workers).items():
            self.free[host][name] = self.free[host].get(name, 0.0) - amount

    def leave_overfull_hosts(self, order: list[str]) -> None:
        """A host that lost slots (or resources): the last jobs leave it."""
        free, result = self.free, self.result
        for host in [h for h, left in free.items() if min(left.values()) < -1e-9]:
            for job in reversed(order):
                while result[job].get(host, 0) and min(free[host].values()) < -1e-9:
                    result[job][host] -= 1
                    self.take(job, host, -1)
                if not result[job].get(host, 1):
                    del result[job][host]

    def room(self, job: str, host: str) -> int:
        """Workers of `job` that fit on `host`; a job that uses GPUs shares a host with no other
        such job (each job's workers number their GPUs from 0 on the host)."""
        asks = self.demand.get(job, {})
        if asks.get(GPU, 0) > 0 and any(other != job and n and self.demand.get(other, {}).get(GPU, 0) > 0
                                        for other, placed in self.result.items() for h, n in placed.items()
                                        if h == host):
            return 0
        return room_in(self.free[host], asks)

    def grow(self, job: str, placement: Placement, need: int) -> None:
        """Add `need` workers: in whole groups on each host where they fit so, then the rest."""
        group = self.groups.get(job, 1)
        if group > 1:
            need = self._grow_on(job, placement, need, group)
        self._grow_on(job, placement, need, 1)

    def _grow_on(self, job: str, placement: Placement, need: int, group: int) -> int:
        """Add up to `need` workers, each host's count for `job` left a multiple of `group`: own
        hosts first, then the host that fits the rest best. What could not be placed so."""
        free, hosts = self.free, self.hosts

        def fits(host: str) -> int:
            has, more = placement.get(host, 0), min(self.room(job, host), need)
            return more - (has + more) % group

        for host in sorted((h for h in placement if fits(h) > 0), key=lambda h: (-free[h][SLOTS], h)):
            n = fits(host)
            placement[host] += n
            self.take(job, host, n)
            need -= n
            if need == 0:
                return 0
        while need > 0:
            rooms = {h: r for h in free if h not in placement and (r := fits(h)) > 0}
            if not rooms:
                return need
            whole = [h for h, r in rooms.items() if r >= need]
            if whole:  # the rest fits on one host: the one it fills best (empty hosts stay whole)
                host = min(whole, key=lambda h: (rooms[h], -(hosts[h] - free[h][SLOTS]), h))
            else:  # the host with the most room (the fewest hosts for the slots it needs)
                host = min(rooms, key=lambda h: (-rooms[h], hosts[h] - free[h][SLOTS], h))
            n = min(rooms[host], need)
            placement[host] = n
            self.take(job, host, n)
            need -= n
        return 0

    def pack(self, job: str, size: int) -> None:
        """A resized job spread over more hosts than it needs is packed again: it pauses for the
        resize anyway, so it may as well span fewer hosts."""
        placement = self.result[job]
        kept_free = {h: dict(left) for h, left in self.free.items()}
        for host, n in placement.items():
            self.take(job, host, -n)
        packed: Placement = {}
        self.grow(job, packed, size)
        if sum(packed.values()) == sum(placement.values()) and len(packed) < len(placement):
            self.result[job] = packed
        else:
            self.free.clear()
            self.free.update(kept_free)
