"""How a job's next generation comes about, and what each host must run meanwhile.

`Formation.reconcile` brings the job one step closer to what its facts call for: workers on
hosts it may no longer use retire, the first generation is planned once its hosts are there, a
finished generation is followed by the next, a healthy one is interrupted at its next commit
when the ring should change, newcomers are started on free slots, and every agent is told the
full list of workers to run (`RunWorkers`, when it changed).

- *planned*: the first generation, and every generation of a job whose workers cannot rejoin in
  place (plain `torch.distributed` scripts, restarted as a whole like torchrun). Workers are
  spawned with their rank in their environment.
- *formed*: an elastic job (workers run `hvd.elastic.run`). Survivors and warmed-up newcomers
  call `Ready`; once every live member of the last generation is ready, ranks are assigned
  (survivors first, in their old order) and sent over the workers' streams. After a failure the
  survivors in session are not waited for: they roll back and ask by themselves, so their next
  assignment goes with the "generation over" (`_rejoins_at_once`).

Pure: no I/O, the time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ringmaster.common.events import Kind
from ringmaster.rendezvous.control.assignment import WorkerSlot, appended_ranks, assign_ranks, host_counts
from ringmaster.rendezvous.control.effects import EndGeneration, RunWorkers, WorkerLaunch
from ringmaster.rendezvous.control.groups import arrange, pack, whole_groups
from ringmaster.rendezvous.control.host_updates import HostUpdates
from ringmaster.rendezvous.control.job import Job
from ringmaster.rendezvous.control.policies import generation_policy, policy_of
from ringmaster.rendezvous.control.records import Generation, JobOutcome, Phase, ResetCause, Worker
from ringmaster.rendezvous.control.worker_env import base_env, rank_env, tentative_rank_env

#: Returns (host, port) of a fresh TCPStore for a planned generation's plain workers.
StoreFactory = Callable[[int], tuple[str, int]]


#: The workers of a host that runs none (one list, so that it is the same list every time).
_NOBODY: list[Worker] = []


@dataclass
class QuietInputs:
    """Members of the current generation (on hosts that stay, within their slots) whose next
    input changes nothing a pass would act on, unless it is the last of its kind awaited:
    - a host update: `waiting` are the members not at their commit yet, `quiet_ready` those whose
      `Ready` needs no pass: the generation forms at the last one, and the pass that forms it
      retires the members on hosts that left (a pass per leaving member's `Ready` retired them one
      by one, and their closing sessions held up the staying members' `Ready`s: half of a
      2,048-host job leaving took 8 s);
    - a healthy generation starting: members still `connecting` once one has connected (a plain
      job's restart rule looks only at the first), and those `not_elastic` once one runs inside
      `hvd.elastic.run` (a host update waits for every member: the last one counts);
    - a healthy generation growing: newcomers still `warming` (the host update waits for the last
      of them to warm up, or for --warmup-grace, which the clock's pass sees); once they were
      `announced` to the members, their sessions opening and their first beats inside
      `hvd.elastic.run` change nothing either (512 newcomers were three passes each over a
      2,048-host job).
    Every other input sets off a pass, which computes these again."""

    waiting: set[str] = field(default_factory=set)
    quiet_ready: set[str] = field(default_factory=set)
    connecting: set[str] = field(default_factory=set)
    not_elastic: set[str] = field(default_factory=set)
    warming: set[str] = field(default_factory=set)
    announced: bool = False

    @staticmethod
    def passed_over(worker_id: str, quiet: set[str], awaited: set[str]) -> bool:
        """Whether `worker_id`'s input needs no pass: it is `quiet` and not the last `awaited`
        (it is then awaited no more)."""
        if worker_id not in quiet or len(awaited) <= 1:
            return False
        quiet.discard(worker_id)
        awaited.discard(worker_id)
        return True


class Formation:
    def __init__(self, job: Job, rendezvous_address: str, plain_store_factory: StoreFactory) -> None:
        self.job = job
        self.pool = job.pool
        self.rendezvous_address = rendezvous_address
        self._plain_store_factory = plain_store_factory
        self.sent_to_agents: dict[str, tuple] = {}  # host -> the worker ids it was last told to run
        #: host -> the list of its workers last looked at, and the key it made (`_publish_agents`)
        self._published: dict[str, tuple[list[Worker], tuple]] = {}
        self._short_since: float | None = None  # since when the job has had fewer slots than --min-np
        self.updates = HostUpdates(job, self.pool, self._over_slots, self._maybe_restart_plain)

    def reconcile(self, now: float) -> None:
        """One step closer to what the facts call for (decided on by the coordinator already)."""
        job = self.job
        eligible = {h.name for h in self.pool.eligible_hosts(now)}
        self._retire_outcasts(eligible, now)
        if job.finishing:
            for worker in job.live_workers():
                # A newcomer still starting up can never join now: it is not waited for.
                if not worker.done and (worker.phase is Phase.READY or not job.is_member(worker)):
                    job.retire_all([(worker, "the job finished while this worker waited for a new ring")], now)
            if not job.live_workers():
                done = sum(1 for w in job.workers.values() if w.done)
                unfinished = job.summary.unfinished
                job.end_job(JobOutcome(not unfinished, f"{done} worker(s) finished training" + (
                    f", but {unfinished[0]}" if unfinished else "")), now)
                return
        else:
            self._check_min_np(now)
            if job.outcome is not None:
                return
            if job.generation is None:
                self._maybe_plan_first(now)
            elif self._generation_finished():
                self._next_generation(now)
            else:
                self.updates.request(eligible, now)
            self._spawn_newcomers(eligible, now)
        self._publish_agents(now)

    def hosts_wanted(self, now: float) -> list[str]:
        """The hosts the job can use now (see `HostPool.hosts_wanted`)."""
        return self.pool.hosts_wanted(now, self.job.limit, self.job.busy_hosts())

    # ------------------------------------------------------------------ who leaves
    def _over_slots(self, now: float) -> dict[str, str]:
        """Workers on hosts that now have fewer slots than they run (a pool that lends one of
        this job's slots on a host to another job, a discovery script that says fewer), with
        why: those on the highest slots go, newcomers before members of the generation."""
        job = self.job
        gen = job.generation
        members = gen.member_set if gen is not None else set()
        on = self.job.census().running
        over: dict[str, str] = {}
        for host in self.pool.eligible_hosts(now):
            workers = on.get(host.name, [])
            if len(workers) <= host.slots:
                continue
            workers = sorted(workers, key=lambda w: (w.worker_id not in members, w.slot))
            for worker in workers[host.slots:]:
                over[worker.worker_id] = f"host {host.name} now lends this job {host.slots} slot(s)"
        return over

    def _retire_outcasts(self, eligible: set[str], now: float) -> None:
        job = self.job
        gen = job.generation
        over = self._over_slots(now)
        # Those on hosts the job may not use, and those over their hosts' slots: found by host,
        # not by a look at every worker (a pass makes this every time).
        running = self.job.census().running
        outcasts = [w for host, on in running.items() if host not in eligible for w in on]
        outcasts += [self.job.workers[i] for i in over]
        leaving: list[tuple[Worker, str]] = []  # (retired together: one word for a host's workers, `Retire.also`)
        for worker in outcasts:
            if worker.stopping:
                continue  # (retired meanwhile)
            reason = over.get(worker.worker_id) or f"host {worker.host} left the job"
            if job.is_member(worker) and gen is not None and gen.over is None:
                policy = policy_of(worker)
                if policy.leaves_at_commit(worker) and gen.update_reached_at is None:
                    continue  # leaves at its next commit, through a host update (reached: it is there)
                if not policy.rejoins(worker):
                    job.retire_all(leaving, now)  # (those before it, in order)
                    leaving = []
                    job.end_generation(reason, now)  # plain job: restart without the host
            leaving.append((worker, reason))
        job.retire_all(leaving, now)

    def _check_min_np(self, now: float) -> None:
        job, started = self.job, self.pool.first_discovery_at
        if started is None:
            return
        if job.generation is None and now - started < job.settings.start_timeout_s:
            return  # agents are still connecting
        capacity = job.capacity(now)
        if capacity >= job.settings.min_np:
            self._short_since = None
            return
        if self._short_since is None:
            self._short_since = now
            job.emit(now, Kind.SLOTS_SHORT, capacity=capacity, min_np=job.settings.min_np,
                     timeout_s=job.settings.elastic_timeout_s)
        elif now - self._short_since >= job.settings.elastic_timeout_s:
            job.fail(
                f"the job needs at least {job.settings.min_np} workers (--min-np) but had only {capacity} "
                f"for {job.settings.elastic_timeout_s:g} s (--elastic-timeout); add hosts or lower --min-np",
                now,
            )

    # ------------------------------------------------------------------ the next generation
    def _maybe_plan_first(self, now: float) -> None:
        """Plan the first generation once the hosts that get its ranks are connected: the first
        hosts in discovery order up to --max-np (all of them without a limit), so rank 0 is on
        the first host listed; after --start-timeout, with whoever is there."""
        started = self.pool.first_discovery_at
        if started is None:
            return
        ready = all(self.pool.hosts[name].agent_connected for name in self.hosts_wanted(now))
        waited = now - started >= self.job.settings.start_timeout_s
        if self.job.capacity(now) >= self.job.settings.min_np and (ready or waited):
            self._plan_generation(now)

    def _generation_finished(self) -> bool:
        """True when no live member of the current generation is still training in it (members
        that are leaving do not hold up the next ring)."""
        gen = self.job.generation
        assert gen is not None
        members = self.job.census().members
        if gen.over is None and gen.update_sequence == 0:
            return all(not w.live for w in members)
        # Members still starting (not connected: importing, building their model) of a failed
        # generation of a job launched elastic do not hold the next ring up: they join a later one
        # as newcomers once they ask (`Job.members_start_later`, `WorkerContext._join_planned`).
        later = gen.over is not None and self.job.members_start_later(gen)  # (once: it looks at every member)
        return all(not w.live or w.stopping or w.phase is Phase.READY or self._rejoins_at_once(w)
                   or (later and w.phase is Phase.SPAWNING) for w in members)

    def _rejoins_at_once(self, worker: Worker) -> bool:
        """A member of a generation that failed, in session and inside `hvd.elastic.run`: it rolls
        back and asks for the next generation by itself, so the next is formed without waiting
        for its `Ready` (which would cost a call per worker and a pass per call, the most of a
        large job's recovery). Its assignment waits in its session until it asks; a `Ready` it
        still sends for the failed generation is already answered (`Coordinator.worker_ready`).
        The same for a member of a generation that a host update interrupts, once one member
        said it reached the update's commit (`HostUpdates.reached`): they all did."""
        gen = self.job.generation
        return (gen is not None and (gen.over is not None or gen.update_reached_at is not None)
                and worker.phase is Phase.MEMBER and worker.generation == gen.number and worker.registered
                and worker.elastic)

    def _next_generation(self, now: float) -> None:
        job = self.job
        gen = job.generation
        assert gen is not None
        if job.awaiting_exits(now):
            return  # a failed worker's status decides whether its host stays: wait for it
        eligible = {h.name for h in self.pool.eligible_hosts(now)}
        over = self._over_slots(now)
        survivors = [job.workers[i] for i in gen.member_ids]
        survivors = [w for w in survivors if self._candidate(w, eligible) and w.worker_id not in over]
        kept = {w.worker_id for w in survivors}  # by id: comparing the records field by field is quadratic
        newcomers = [w for w in job.workers.values()
                     if w.worker_id not in kept and self._candidate(w, eligible) and w.worker_id not in over]
        if not survivors and not newcomers:
            if not any(w.live for w in job.workers.values()):
                job.note_lost_commits(now)
                self._plan_generation(now)  # nothing can rejoin in place: restart everything
            return
        slots = [WorkerSlot(w.worker_id, w.host) for w in (*survivors, *newcomers)]
        group_size = job.settings.group_size
        if group_size > 1:  # whole groups only: a member lost takes its group out (`groups.arrange`)
            placed = arrange(slots[: len(survivors)], gen.member_ids, slots[len(survivors):], group_size,
                             job.limit).placed
        else:
            placed = slots
        if len(placed) < job.settings.min_np:
            return  # wait for newcomers to warm up, or for --elastic-timeout
        if self.updates.awaited_newcomers(now):
            return  # the members reset for the newcomers announced: form with them
        if job.exceeds_reset_limit(now):
            return
        chosen = {slot.worker_id for slot in placed}
        if not any(w.holds_commit for w in survivors if w.worker_id in chosen):
            # newcomers alone, or with members of a generation whose sync was cut off before it
            # gave them the commit (all who held it died passing it on): nobody holds it
            job.note_lost_commits(now)
        if group_size > 1:
            members = assign_ranks(placed, [], None)
        else:
            members = assign_ranks(slots[: len(survivors)], slots[len(survivors):], job.limit)
        new = job.new_generation(members, now)
        for a in members:
            worker = job.workers[a.worker_id]
            worker.join(new.number)
            job.send_assignment(worker)
        self._mark_left(gen, new)
        at_limit = job.limit is not None and len(members) >= job.limit
        left = [w for w in (*survivors, *newcomers) if w.worker_id not in new.member_set]
        if group_size == 1 or at_limit:  # (one word for them all: `Retire.also`)
            job.retire_all([(w, f"the job is limited to {job.limit} workers") for w in left], now)
            return
        for worker in left:
            if worker.phase is Phase.MEMBER:
                # In groups, left over: it waits for a whole group to join with. It was told to
                # rejoin without asking, and it may still be inside a collective of the generation
                # that failed (a Gloo receive that nothing wakes lasts the collective timeout): a
                # ring formed with it then waits for it, the survivors with it. So it is told to
                # ask after all, and is not ready until it does (`Coordinator.worker_ready`).
                worker.move(Phase.WARMING)
                job.outbox.append(EndGeneration(worker.worker_id, gen.number,
                                                "left over: it waits for a whole group to join with", rejoin=False))

    def _candidate(self, worker: Worker, eligible: set[str]) -> bool:
        """Can join the next generation: alive, waiting for it (or sure to), not leaving, on a usable host."""
        return (worker.live and (worker.phase is Phase.READY or self._rejoins_at_once(worker)) and not worker.stopping
                and worker.host in eligible)

    def _plan_generation(self, now: float) -> None:
        """Spawn a whole generation with ranks in the workers' environment."""
        job = self.job
        if job.generation is not None and job.exceeds_reset_limit(now):
            return
        slots: list[WorkerSlot] = []
        pending: list[Worker] = []
        limit = job.limit
        places = [(host.name, slot) for host in self.pool.eligible_hosts(now) for slot in range(host.slots)]
        if job.settings.group_size > 1:  # whole groups, each on as few hosts as it can be
            grouped = pack([WorkerSlot(str(i), host) for i, (host, _) in enumerate(places)], job.settings.group_size)
            places = [places[int(s.worker_id)] for group in grouped for s in group]
        for host_name, slot in places:
            if limit is not None and len(slots) >= limit:
                break
            worker = self.make_worker(host_name, slot)
            slots.append(WorkerSlot(worker.worker_id, host_name))
            pending.append(worker)
        if len(slots) < job.settings.min_np:
            return
        members = assign_ranks([], slots, limit)
        gen = job.new_generation(members, now)
        plain_host, plain_port = self._plain_store_factory(gen.number)
        for worker, a in zip(pending, members):
            worker.generation = gen.number
            worker.env.update(rank_env(a, gen.number, plain_host, plain_port))
            job.workers[worker.worker_id] = worker

    def make_worker(self, host: str, slot: int) -> Worker:
        job = self.job
        worker_id = f"{host}/{job.next_id}"
        job.next_id += 1
        store = "{}:{}".format(*job.store_address)
        return Worker(worker_id, host, slot,
                      base_env(worker_id, host, slot, self.rendezvous_address, store, job.settings))

    # ------------------------------------------------------------------ a healthy generation
    def _mark_left(self, old: Generation, new: Generation) -> None:
        """Each host some of `old`'s live members leave at `new`'s forming says so (`Host.left`):
        the store then keeps their leaving in one host key, not in each leaver's record (half of
        a 4,096 x 8 job leaving rewrote 16,384 workers' keys, 9.7 MB to etcd before the survivors'
        places could go out). (A mark that moves on is safe: a new generation rebuilds every
        worker's record, so earlier leavers on the host are written with their own generation.)"""
        hosts, workers = self.pool.hosts, self.job.workers
        for worker_id in old.member_set - new.member_set:  # (a set difference: not a look at every member)
            worker = workers.get(worker_id)
            if worker is None or not worker.live:
                continue  # (a dead member's key goes: nothing to say for it)
            host = hosts.get(worker.host)
            if host is not None and host.left != old.number:
                host.left = old.number

    def quiet_inputs(self, now: float) -> QuietInputs:
        """Inputs from members that a pass over the job would not act on, as things stand after
        one (see `QuietInputs`). With thousands of members each pass costs milliseconds, and a
        pass per input made a generation's start and a host update quadratic."""
        job = self.job
        gen = job.generation
        quiet = QuietInputs()
        if gen is None or gen.over is not None or job.finishing:
            return quiet
        members = job.census().members
        eligible = {h.name for h in self.pool.eligible_hosts(now)}
        over = self._over_slots(now)

        def stays(w: Worker) -> bool:
            return w.host in eligible and w.worker_id not in over

        if gen.update_sequence:
            waiting = [w for w in members if w.live and not w.stopping and w.phase is not Phase.READY]
            quiet.waiting = {w.worker_id for w in waiting}
            quiet.quiet_ready = {w.worker_id for w in waiting if stays(w) or policy_of(w).rejoins(w)}
            return quiet
        quiet.warming = {w.worker_id for w in self.updates.newcomers(eligible)[1]} - gen.member_set
        quiet.announced = bool(gen.announced_sequence)
        # (each a look at every member, but one that builds nothing unless a member still starts)
        if any(w.registered for w in members):
            quiet.connecting = {w.worker_id for w in members
                                if w.phase is Phase.SPAWNING and w.live and not w.stopping and stays(w)}
        if any(w.elastic for w in members):
            quiet.not_elastic = {w.worker_id for w in members
                                 if not w.elastic and w.live and not w.stopping and stays(w)}
        return quiet

    def _maybe_restart_plain(self, members: list[Worker], now: float) -> None:
        """A plain job grows only by restarting, as torchrun does on a membership change."""
        job = self.job
        size = sum(1 for w in members if w.live)
        capacity = job.capacity(now)
        if capacity > size:
            job.causes.add(f"capacity grew to {capacity}", ResetCause.HOST_ADDED)
            job.end_generation(f"more slots available ({capacity} > {size}); restarting all workers", now)
        elif job.limit is not None and size > job.limit:
            job.end_generation(f"scaled down to {job.limit} workers; restarting all workers", now)

    def _spawn_newcomers(self, eligible: set[str], now: float) -> None:
        """Elastic job: start workers on free slots; they join once warmed up."""
        job = self.job
        gen = job.generation
        census = job.census()  # (as it was before any newcomer: its lists stay as they are)
        if gen is None or not generation_policy(census.members, job.settings.elastic).grows_in_place():
            return
        running = census.running
        room = (job.limit if job.limit is not None else 1 << 30) - sum(map(len, running.values()))
        started: list[Worker] = []
        undecided = job.awaiting_exits(now)  # may be blacklisted in a moment: do not refill yet
        free: list[tuple[str, int]] = []
        for host in self.pool.eligible_hosts(now):
            if host.name not in undecided:
                used = {w.slot for w in running.get(host.name, ())}
                free += [(host.name, slot) for slot in range(host.slots) if slot not in used]
        free = free[:max(room, 0)]
        if job.settings.group_size > 1:  # only what completes whole groups with the workers waiting
            waiting = sum(1 for on in running.values() for w in on if w.worker_id not in gen.member_set)
            free = free[: max(whole_groups(waiting + len(free), job.settings.group_size) - waiting, 0)]
        for host_name, slot in free:
            worker = self.make_worker(host_name, slot)
            job.workers[worker.worker_id] = worker
            job.emit(now, Kind.WORKER_STARTING, worker=worker.worker_id, host=host_name)
            started.append(worker)
        if started:
            members = census.members
            if all(w.elastic for w in members if w.live):
                self.updates.announce(members, started, now)
            # The workers staying, in the order `_next_generation` gives them (members in rank
            # order, then the others, in the order they were added), counted by host: where the
            # newcomers go after them.
            member_set = gen.member_set
            staying = [w for w in members if w.live and not w.stopping]
            staying += [w for w in census.live if not w.stopping and w.worker_id not in member_set]
            expected = appended_ranks(host_counts(w.host for w in staying),
                                      [WorkerSlot(w.worker_id, w.host) for w in started])
            for worker, a in zip(started, expected):
                worker.env.update(tentative_rank_env(a))

    # ------------------------------------------------------------------ what each host runs
    def _publish_agents(self, now: float) -> None:
        """Tell each agent which workers to run. A retiring worker that can hear the rendezvous
        gets `stop_grace_s` to leave by itself before its agent sends SIGTERM; a crashed one
        whose exit status is awaited is left to exit by itself (for `exit_report_timeout_s`)."""
        job = self.job
        job.awaiting_exits(now)  # drops those waited for long enough
        awaited = job.exit_awaited  # crashed, still exiting: its agent must not stop it and hide its status
        grace = job.settings.stop_grace_s
        census = job.census()
        by_host: dict[str, list[Worker]]
        if not awaited and not census.leaving:
            by_host = census.running  # (shared, and the same lists while a host's workers are unchanged)
        else:
            by_host = {}
            # (the live workers, from the census, unless a failed one's exit is awaited: then all)
            for w in (job.workers.values() if awaited else census.live):
                if (w.live and (not w.stopping or (w.registered and now - w.stop_requested_at < grace))) \
                        or (w.worker_id in awaited and w.phase is not Phase.EXITED):
                    on = by_host.get(w.host)
                    if on is None:
                        by_host[w.host] = [w]
                    else:
                        on.append(w)
        sent, published = self.sent_to_agents, self._published
        for host in self.pool.hosts.values():
            if not host.agent_connected:
                continue
            name = host.name
            specs = by_host.get(name, _NOBODY)
            last = published.get(name)
            if last is not None and last[0] is specs and sent.get(name) is last[1]:
                continue  # (the very list last told, and nothing told since: a host's check costs no key)
            key = tuple([w.worker_id for w in specs])  # (in the order workers were added: no sort needed)
            published[name] = (specs, key)
            if sent.get(name) == key:
                sent[name] = key
                continue
            sent[name] = key
            argv = tuple(job.settings.command)
            job.outbox.append(RunWorkers(host.name,
                                         tuple(WorkerLaunch(w.worker_id, w.slot, argv, dict(w.env)) for w in specs)))
