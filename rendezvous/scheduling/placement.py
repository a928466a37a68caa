"""Where each job's workers go, given its target size: as few hosts as possible (fewer links
between hosts in its rings), ties broken toward the emptiest host (load evened out), and a
running job's workers never moved without cause.

A job that shrinks gives back slots on the hosts where it has the fewest first (it leaves whole
hosts, and keeps its densest ones); a job that grows first fills the free slots of hosts it is
already on, then takes the hosts with the most free slots (the fewest hosts for the slots it
needs). Workers on hosts that are gone (failed, blacklisted, drained) are simply not kept.
Pure: hosts' slots, current placements and target sizes in; placements out.
"""

from __future__ import annotations

from typing import Mapping

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
          order: list[str]) -> dict[str, Placement]:
    """Each job's placement. `hosts`: usable hosts and their slots; `current`: where jobs run now;
    `sizes`: target sizes (their sum at most the slots); `order`: jobs in the order they are
    placed (precedence). Raises ValueError when the sizes do not fit the slots."""
    if sum(sizes.values()) > sum(hosts.values()):
        raise ValueError(f"sizes {dict(sizes)} need more than the pool's {sum(hosts.values())} slots")
    result: dict[str, Placement] = {}
    for job in order:  # first, what every job keeps
        usable = {h: n for h, n in current.get(job, {}).items() if h in hosts}
        size = sizes.get(job, 0)
        result[job] = _shrink(usable, size) if sum(usable.values()) >= size else usable
    free = dict(hosts)
    for placement in result.values():
        for host, n in placement.items():
            free[host] -= n
    for host in [h for h, n in free.items() if n < 0]:  # a host that lost slots: the last jobs leave it
        for job in reversed(order):
            if free[host] >= 0:
                break
            take = min(result[job].get(host, 0), -free[host])
            if take:
                result[job][host] -= take
                free[host] += take
                if result[job][host] == 0:
                    del result[job][host]
    for job in order:  # then growth: own hosts first, then the emptiest hosts
        need = sizes.get(job, 0) - sum(result[job].values())
        if need <= 0:
            continue
        placement = result[job]
        own = sorted((h for h in placement if free[h] > 0), key=lambda h: (-free[h], h))
        others = sorted((h for h in free if h not in placement and free[h] > 0),
                        key=lambda h: (-free[h], hosts[h] - free[h], h))
        for host in own + others:
            take = min(free[host], need)
            if take <= 0:
                continue
            placement[host] = placement.get(host, 0) + take
            free[host] -= take
            need -= take
            if need == 0:
                break
        if need > 0:  # (cannot happen when the sizes fit: what is kept is within each host's slots)
            raise ValueError(f"job {job}: {need} slot(s) could not be placed")
    return result
