"""What the rendezvous does with the hosts the straggler check found slow (`stragglers`): each is
told once per generation; with `--stragglers replace` it is drained (its workers leave at their
next commit) where the job is faster without it: another host takes its workers, or the job
runs faster on the rest."""

from __future__ import annotations

from ringmaster.common.errors import Refused
from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.drains import Drains
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.records import DrainSource
from ringmaster.rendezvous.control.stragglers import Straggler, replacing_pays


class StragglerAction:
    def __init__(self, job: Job, pool: HostPool, drains: Drains) -> None:
        self.job, self.pool, self.drains = job, pool, drains
        self._told: set[tuple[int, str]] = set()  # (generation, host) of stragglers reported

    def seen(self, found: list[Straggler], now: float) -> bool:
        """Act on the hosts found slow; True when a drain was asked (the job must settle)."""
        job, settings = self.job, self.job.settings
        gen = job.generation
        if gen is None or job.outcome is not None:
            return False
        members = {a.host for a in gen.members}  # (a host with only warming workers is spare)
        blacklist = self.pool.blacklist
        spare = sum(h.slots for h in self.pool.ordered_hosts()
                    if h.name not in members and h.drain is None and not blacklist.is_blacklisted(h.name, now))
        drained = False
        for straggler in found:
            if (gen.number, straggler.host) in self._told:
                continue
            self._told.add((gen.number, straggler.host))
            on_host = sum(1 for a in gen.members if a.host == straggler.host)
            replace = settings.stragglers == "replace" and replacing_pays(straggler, len(gen.members), on_host, spare)
            job.emit(now, Kind.STRAGGLER_FOUND, host=straggler.host, slowdown=round(straggler.slowdown, 3),
                     pace_s=round(straggler.pace_s, 6), others_s=round(straggler.others_s, 6),
                     steps=settings.straggler_steps, action=_action(replace, settings.stragglers, on_host, spare,
                                                                    len(gen.members)),
                     replaced=replace, generation=gen.number)
            if replace:
                spare -= on_host
                try:
                    self.drains.request(straggler.host, DrainSource.STRAGGLER, settings.drain_grace_s,
                                        f"straggler, {straggler.slowdown:.2f}x slower than the other hosts", now)
                except Refused:
                    continue
                drained = True
        self._told = {k for k in self._told if k[0] >= gen.number - 1}
        return drained


def _action(replace: bool, policy: str, on_host: int, spare: int, members: int) -> str:
    """What is done with a straggler, as its event says it."""
    if policy != "replace":
        return "kept (--stragglers report)"
    if replace:
        return "replaced: its workers leave at their next commit" + (
            ", another host takes them" if spare >= on_host else ", the job is faster on the rest")
    return (f"kept: no spare host for its {on_host} worker(s), and the job is not faster without them "
            f"({members - on_host} of {members} workers)")
