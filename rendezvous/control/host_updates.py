"""A healthy generation interrupted at its next commit when its ring should change (Horovod's host
update): newcomers ready on free slots (in whole groups), members on hosts that leave or lost
slots, a scale-down; and newcomers announced to the members while they warm up, so that a script
that awaits them resets for them (`awaits_announced`). Pure: no I/O, the time is passed in."""

from __future__ import annotations

from typing import Callable

from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.effects import AnnounceHosts, EndGeneration, UpdateHosts
from ringmaster.rendezvous.control.host_pool import HostPool
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.listing import listed
from ringmaster.rendezvous.control.policies import generation_policy
from ringmaster.rendezvous.control.records import Phase, ResetCause, Worker


class HostUpdates:
    def __init__(self, job: Job, pool: HostPool, over_slots: Callable[[float], dict[str, str]],
                 restart_plain: Callable[[list[Worker], float], None]) -> None:
        """`over_slots(now)`: members beyond their hosts' slots; `restart_plain(members, now)`: a
        plain generation's restart rule (it does not grow in place)."""
        self.job, self.pool = job, pool
        self._over_slots = over_slots
        self._restart_plain = restart_plain

    def request(self, eligible: set[str], now: float) -> None:
        """Elastic job, healthy generation: interrupt it at the next commit if the ring should change."""
        job = self.job
        gen = job.generation
        assert gen is not None
        if gen.over is not None:
            return
        members = job.census().members
        if gen.update_sequence:
            # a drain left too few after the update went out: say it again, with a checkpoint
            if job.checkpoint_at_update:
                self.send(members, "a drain leaves fewer workers than --min-np: rank 0 checkpoints first", now)
            return
        if gen.awaited_at is not None:  # members reset for the announcement: the update is theirs now
            reason = "the workers awaited the announced hosts"
            job.causes.add_kinds_if_none(reason, {ResetCause.HOST_ADDED})
            self.send(members, reason, now, placed=False)  # (they asked already)
            return
        policy = generation_policy(members, job.settings.elastic)
        if not policy.grows_in_place():
            if not any(policy.rejoins(w) for w in members):
                self._restart_plain(members, now)
            return
        # (one look at every member for all that follows: a pass makes this)
        over = self._over_slots(now)
        live = 0
        leaving: list[Worker] = []
        fewer: list[Worker] = []
        for w in members:
            if not w.live:
                continue
            if not w.elastic:
                return  # still starting up: not every member is inside hvd.elastic.run yet
            live += 1
            if w.host not in eligible:
                leaving.append(w)
            elif w.worker_id in over:
                fewer.append(w)
        reasons = []
        ready_newcomers, warming = self.newcomers(eligible)
        limit = job.limit if job.limit is not None else 1 << 30
        room = limit - len(members)
        if ready_newcomers and warming and now - min(w.ready_at for w in ready_newcomers) < job.settings.warmup_grace_s:
            ready_newcomers = []  # let the others finish warming up and join in the same reset
        kinds = set()
        if len(ready_newcomers) >= job.settings.group_size and room >= job.settings.group_size:  # (whole groups)
            reasons.append("new worker(s) ready: " + listed(w.worker_id for w in ready_newcomers[:room]))
            kinds.add(ResetCause.HOST_ADDED)
        if leaving:
            reasons.append("host(s) leaving: " + listed(sorted({w.host for w in leaving})))
            kinds.add(ResetCause.HOST_REMOVED)
        if fewer:
            reasons.append("fewer slots on " + listed(sorted({w.host for w in fewer})))
            kinds.add(ResetCause.HOST_REMOVED)
        if live > limit:
            reasons.append(f"scaling down to {limit} workers")
            kinds.add(ResetCause.SCALE)
        if not reasons:
            if warming and room > 0:
                self.announce(members, warming, now)
            return
        reason = "; ".join(reasons)
        job.causes.add_kinds_if_none(reason, kinds)  # (discovery or a scale request said it first where they caused it)
        self.send(members, reason, now)

    def newcomers(self, eligible: set[str]) -> tuple[list[Worker], list[Worker]]:
        """Workers outside the generation on usable hosts: those ready to join, those still
        starting or warming up (a planned generation's members too, until they connect). From
        the census' workers waiting to join, not a look at every worker (a pass asks twice)."""
        ready: list[Worker] = []
        warming: list[Worker] = []
        for w in self.job.census().joining:
            if w.host in eligible:
                (ready if w.phase is Phase.READY else warming).append(w)
        return ready, warming

    def send(self, members: list[Worker], reason: str, now: float, placed: bool = True) -> None:
        """Interrupt the generation at its next commit (a higher sequence than any sent: the
        newest wins); with a checkpoint first when a drain asked for one.

        Every member raises at the same commit (its allreduce agrees on the newest update), so
        one member's word that it reached it is every member's: with `placed`, the first live
        member reports it (its `Ready`) and the others are told their next place or to leave
        without asking (`reached`, `Formation._rejoins_at_once`). A `Ready` from each of 32,768
        members was most of a large job's growth (a carried call per host, a pass, the members'
        pause waiting for the slowest)."""
        job = self.job
        gen = job.generation
        assert gen is not None
        job.hosts_sequence += 1
        gen.update_sequence = job.hosts_sequence
        job.emit(now, Kind.HOSTS_UPDATED, reason=reason)
        checkpoint, job.checkpoint_at_update = job.checkpoint_at_update, False
        placed = placed and not checkpoint  # (a drain's checkpoint: every member asks, once it is written)
        told = [w for w in members if w.live and w.registered]
        reporter = next((w.worker_id for w in told if not w.stopping), None) if placed else None
        if reporter is not None:
            job.outbox.append(UpdateHosts(reporter, gen.update_sequence, reason, checkpoint, False, gen.number))
        others = [w.worker_id for w in told if w.worker_id != reporter]
        if others:  # (one effect for them all: `UpdateHosts.also`)
            job.outbox.append(UpdateHosts(others[0], gen.update_sequence, reason, checkpoint, placed, gen.number,
                                          also=tuple(others[1:])))
        gen.update_reporter = reporter or ""

    def reached(self, worker: Worker, after_generation: int, failure: str, now: float) -> bool:
        """A member's `Ready` after its commit at the pending host update, the first: every
        live member is at that commit (or fails), so the next ring forms now (True: it needs a
        pass even if other members' `Ready`s are still awaited)."""
        gen = self.job.generation
        if (failure or gen is None or gen.over is not None or not gen.update_reporter or gen.awaited_at is not None
                or gen.update_reached_at is not None or after_generation != gen.number
                or worker.worker_id not in gen.member_set):
            return False
        gen.update_reached_at = now
        return True

    def announce(self, members: list[Worker], warming: list[Worker], now: float) -> None:
        """Tell a healthy generation's members at once that newcomers are coming (once per
        generation). Horovod's driver tells its workers of new hosts as it discovers them, and
        its scripts wait for that (`state._host_messages`); the interrupt itself still waits for
        the newcomers to be ready, so the members train on while they warm up, unless a member's
        script awaits the change (its `Ready` says `awaits_hosts`: `Coordinator.worker_ready`)."""
        job = self.job
        gen = job.generation
        assert gen is not None
        if gen.announced_sequence or gen.update_sequence or gen.over is not None:
            return
        job.hosts_sequence += 1  # (a number of its own: an announcement never reads as a later generation's update)
        gen.announced_sequence = job.hosts_sequence
        reason = "new worker(s) warming up: " + listed(w.worker_id for w in warming)
        job.emit(now, Kind.HOSTS_ANNOUNCED, reason=reason)
        told = [w.worker_id for w in members if w.live and w.registered]
        if told:  # (one effect for them all)
            job.outbox.append(AnnounceHosts(told[0], gen.announced_sequence, reason, also=tuple(told[1:])))

    def retell(self, worker: Worker) -> None:
        """What a member that (re)connects is told again: its generation's end, or its place and
        the host update or announcement its generation had (a session closed meanwhile missed
        them, and a rendezvous that took over cannot know which it heard)."""
        job = self.job
        gen = job.generation
        if worker.phase is not Phase.MEMBER or gen is None:
            return
        if gen.over is not None:
            job.outbox.append(EndGeneration(worker.worker_id, gen.number, gen.over, rejoin=worker.elastic))
            return
        job.send_assignment(worker)
        if gen.update_sequence:
            # A host update went out while its session was closed: say it again, or it trains on
            # alone at its next commit while the others wait for it.
            job.outbox.append(UpdateHosts(worker.worker_id, gen.update_sequence,
                                          "the hosts changed while this worker was reconnecting", False))
        elif gen.announced_sequence:
            job.outbox.append(AnnounceHosts(worker.worker_id, gen.announced_sequence,
                                            "newcomers were announced while this worker was reconnecting"))

    def awaits_announced(self, worker: Worker, sequence: int, now: float) -> bool:
        """A member reset for its generation's announcement (its script awaited the change):
        the next ring waits for the newcomers, as Horovod's reset does (`_next_generation`)."""
        gen = self.job.generation
        if gen is None or gen.over is not None or gen.update_sequence or not gen.announced_sequence \
                or sequence != gen.announced_sequence or worker.worker_id not in gen.member_set:
            return False
        if gen.awaited_at is None:
            gen.awaited_at = now
        return True

    def awaited_newcomers(self, now: float) -> bool:
        """Whether the next ring waits for newcomers still warming up: a member awaited them
        (`awaits_announced`), for at most --start-timeout."""
        job = self.job
        gen = job.generation
        if gen is None or gen.awaited_at is None or now - gen.awaited_at >= job.settings.start_timeout_s:
            return False
        eligible = {h.name for h in self.pool.eligible_hosts(now)}
        return bool(self.newcomers(eligible)[1])

