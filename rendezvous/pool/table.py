"""The pool's jobs: what was submitted, where each job is in its life, and the checks a
submission must pass. Pure: the time and the pool's capacity are passed in; the service acts.

A job's life: `queued` -> `running` (its own rendezvous leads it on the hosts the policy gave)
-> `succeeded` | `failed` | `cancelled`; a running job the policy takes whole goes `suspending`
(a durable checkpoint at its next commit, then its workers stop) -> `suspended`, and back to
`running` from that checkpoint when slots return. `cancelling` is a cancel on its way.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ringmaster.common.errors import Refused
from ringmaster.rendezvous.scheduling.model import DEFAULT_QUEUE, JobAsk
from ringmaster.rendezvous.scheduling.resources import RESOURCES
from ringmaster.rendezvous.scheduling.throughput import Scaling
from ringmaster.settings import MAX_GROUP_SIZE, nearest_whole_groups

#: Priorities a job may have (`--priority`): wide enough for any scheme, bounded.
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000
#: Jobs not yet ended that the pool holds at most: a flood of submits is refused, not kept.
MAX_LIVE_JOBS = 1000
#: Submissions accepted per minute at most (across all queues).
MAX_SUBMITS_PER_MINUTE = 600
#: Ended jobs remembered (for `ringmaster jobs` and `logs`); older ones are forgotten.
KEEP_ENDED = 500
#: Changes of size remembered per job (the page's line of its size over time).
SIZES_KEPT = 1000
#: Longest name and command a job may have.
MAX_NAME = 64
MAX_COMMAND_ARGS, MAX_COMMAND_CHARS = 1000, 64 * 1024
#: Most of one resource a worker may ask for.
MAX_DEMAND = 1e6
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

def whole_groups_refusal(flag: str, count: int, group_size: int, who: str = "the job trains in") -> str:
    """Why `count` workers cannot be: not a whole number of replica groups; the nearest that are."""
    return (f"{flag} {count} is not a whole number of groups: {who} groups of {group_size} (--group-size); give "
            f"{nearest_whole_groups(count, group_size)}")


class TooMany(Refused):
    """A submission refused for the pool's bounds on jobs and submissions (HTTP 429)."""


LIVE = ("queued", "running", "suspending", "suspended", "cancelling")
ENDED = ("succeeded", "failed", "cancelled")


@dataclass
class PoolJob:
    id: str
    name: str
    queue: str
    priority: int
    min_np: int
    max_np: int
    command: list[str]
    submitted: float
    state: str = "queued"
    placement: dict[str, int] = field(default_factory=dict)
    resized_at: float | None = None  # when it was resized, then when it first trained at that size
    urgent: bool = False
    settled: bool = True  # it has trained at its placement (False from a resize until its generation forms)
    reason: str = "queued"
    message: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    resumes: int = 0
    submitted_max_np: int = 0  # the most it may be scaled to (its --max-np at submission)
    api_url: str | None = None
    sizes: list[tuple[float, int]] = field(default_factory=list)  # (time, size): its size over time
    last_view: Any = None  # its rendezvous' last JobView once that has stopped (its events, for `logs`)
    last_view_wall: float = 0.0  # seconds since the epoch at that view's time
    demand: dict[str, float] = field(default_factory=dict)  # per worker, besides its slot (gpu, cpu)
    group_size: int = 1  # workers per replica group (--group-size): it is sized in whole groups

    @property
    def size(self) -> int:
        return sum(self.placement.values())

    def sized(self, now: float) -> None:
        """Note its size now (its size over time, the newest SIZES_KEPT changes)."""
        self.sizes.append((now, self.size))
        del self.sizes[:-SIZES_KEPT]

    def attained(self, now: float) -> float:
        """Slot-seconds it has run (from its sizes over time)."""
        total = 0.0
        for (at, size), (until, _) in zip(self.sizes, [*self.sizes[1:], (now, 0)]):
            total += size * max(0.0, until - at)
        return total

    def ask(self, now: float = 0.0, scaling: Scaling | None = None, settle_within_s: float = float("inf")) -> JobAsk:
        """The job as the policy sees it (`scaling`: as measured, for `goodput`). A resize it has
        not taken within `settle_within_s` (the start timeout: its newcomers were given up on) no
        longer holds it."""
        settling = not self.settled and self.resized_at is not None and now - self.resized_at < settle_within_s
        return JobAsk(self.id, self.min_np, self.max_np, self.submitted, self.queue, self.priority,
                      dict(self.placement) if self.state == "running" else {}, self.resized_at, self.urgent,
                      settling, dict(self.demand), attained_s=self.attained(now), scaling=scaling,
                      group_size=self.group_size)

    def formed(self, hosts: Mapping[str, int], now: float) -> None:
        """Its rendezvous formed a generation on `hosts` (workers per host): once that is its
        placement, it has taken its last resize, and the interval between resizes counts from now."""
        if not self.settled and self.state == "running" and dict(hosts) == self.placement:
            self.settled, self.resized_at = True, now


class JobTable:
    def __init__(self, queues: set[str]) -> None:
        """`queues`: the names a job may be submitted to (--queue-weights' and `default`)."""
        self.queues = set(queues) | {DEFAULT_QUEUE}
        self.jobs: dict[str, PoolJob] = {}
        self._count = 0
        self._recent: collections.deque[float] = collections.deque()
        self.forgotten: list[str] = []  # ids of ended jobs forgotten since the store last heard

    def submit(self, command: list[str], min_np: int, max_np: int | None, now: float, capacity: int,
               name: str | None = None,
               queue: str = DEFAULT_QUEUE, priority: int = 0, taken: Callable[[str], bool] = lambda _: False,
               demand: Mapping[str, float] | None = None, totals: Mapping[str, float] | None = None,
               group_size: int = 1) -> PoolJob:
        """A new queued job, or `Refused` naming what was wrong. `capacity`: the most slots the
        pool has (a job whose minimum exceeds it could never start); `taken(id)`: whether an id
        was used before this table (its checkpoints are on disk: a new job must not resume them);
        `demand`: what each worker takes besides its slot, out of the pool's `totals` (None: the
        hosts are not known yet, nothing is checked against them); `group_size`: workers per replica
        group (--group-size), which --min-np and --max-np must count whole."""
        max_np = max_np if max_np is not None else min_np
        demand = {name_: float(amount) for name_, amount in (demand or {}).items() if amount}
        for resource, amount in demand.items():
            if resource not in RESOURCES:
                raise Refused(f"unknown resource {resource[:40]!r}: a worker may ask for {', '.join(RESOURCES)}")
            if not 0 < amount <= MAX_DEMAND:
                raise Refused(f"{amount:g} {resource} per worker: ask for more than 0 and at most {MAX_DEMAND:g}")
            if totals is not None and amount * min_np > totals.get(resource, 0.0):
                raise Refused(f"--min-np {min_np} workers with {amount:g} {resource} each need {amount * min_np:g} "
                              f"{resource}; the pool's hosts declare {totals.get(resource, 0.0):g} in all: the job "
                              "could never start")
        if not command or not command[0]:
            raise Refused("no command: give the training command, e.g. python train.py")
        if len(command) > MAX_COMMAND_ARGS or sum(len(a) for a in command) > MAX_COMMAND_CHARS:
            raise Refused(f"the command is longer than {MAX_COMMAND_ARGS} arguments or {MAX_COMMAND_CHARS} characters")
        if any("\x00" in a for a in command):
            raise Refused("the command holds a NUL character")
        if not 1 <= min_np <= max_np:
            raise Refused(f"--min-np {min_np} and --max-np {max_np}: need 1 <= min-np <= max-np")
        if not 1 <= group_size <= MAX_GROUP_SIZE:
            raise Refused(
                f"--group-size {group_size}: give 1 (no groups) to {MAX_GROUP_SIZE} workers per replica group"
            )
        for flag, count in (("--min-np", min_np), ("--max-np", max_np)):
            if count % group_size:
                raise Refused(whole_groups_refusal(flag, count, group_size))
        if min_np > capacity:
            raise Refused(f"--min-np {min_np} is more than the pool's {capacity} slots: the job could never start "
                          "(its workers start together or not at all)")
        if queue not in self.queues:
            raise Refused(f"unknown queue {queue!r}: this pool has {', '.join(sorted(self.queues))}")
        if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise Refused(f"--priority {priority} is outside {MIN_PRIORITY}..{MAX_PRIORITY}")
        if name is not None and not _NAME.fullmatch(name):
            raise Refused(f"--name {name[:80]!r}: 1 to {MAX_NAME} letters, digits, '.', '_' or '-', starting with a "
                          "letter or digit")
        while self._recent and self._recent[0] < now - 60:
            self._recent.popleft()
        if len(self._recent) >= MAX_SUBMITS_PER_MINUTE:
            raise TooMany(f"more than {MAX_SUBMITS_PER_MINUTE} submissions in the last minute: try again shortly")
        if sum(1 for j in self.jobs.values() if j.state in LIVE) >= MAX_LIVE_JOBS:
            raise TooMany(f"the pool already holds {MAX_LIVE_JOBS} jobs that have not ended: cancel some or wait")
        self._recent.append(now)
        self._count += 1
        while taken(f"{name or 'job'}-{self._count}") or f"{name or 'job'}-{self._count}" in self.jobs:
            self._count += 1
        job_id = f"{name or 'job'}-{self._count}"
        job = PoolJob(job_id, name or job_id, queue, priority, min_np, max_np, list(command), now,
                      submitted_max_np=max_np, demand=demand, group_size=group_size)
        self.jobs[job_id] = job
        self._forget_old()
        return job

    def load(self, jobs: list[PoolJob]) -> None:
        """Jobs a store kept (a pool started again): taken up as they are, their ids not reused."""
        for job in jobs:
            self.jobs[job.id] = job
        self._forget_old()

    def get(self, job_id: str) -> PoolJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise KeyError(f"no job {job_id[:80]!r} in this pool (ringmaster jobs lists them)")
        return job

    def cancel(self, job_id: str, now: float) -> PoolJob:
        """Mark a job to be cancelled: a queued or suspended one ends at once, a running one once
        its rendezvous has stopped it (the service does that). `Refused` for one that ended."""
        job = self.get(job_id)
        if job.state in ENDED:
            raise Refused(f"job {job_id} has already ended ({job.state}): nothing to cancel")
        if job.state in ("queued", "suspended"):
            self.end(job, "cancelled",
                     "cancelled before it ran" if job.state == "queued" else "cancelled while suspended",
                     now)
        elif job.state != "cancelling":
            job.state = "cancelling"
            job.reason = "cancelling: its workers are being stopped"
        return job

    def scale(self, job_id: str, np: int) -> PoolJob:
        """`ringmaster scale --job ID -np N`: the most workers the job may have from now on (the
        pool grows or shrinks it toward that at its next commit), within its --min-np and the
        --max-np it was submitted with."""
        job = self.get(job_id)
        if job.state not in LIVE or job.state == "cancelling":
            raise Refused(f"job {job_id} is {job.state}: it cannot be scaled")
        if not job.min_np <= np <= job.submitted_max_np:
            raise Refused(f"-np {np}: job {job_id} takes {job.min_np} to {job.submitted_max_np} workers (its --min-np "
                          "and --max-np)")
        if np % job.group_size:
            raise Refused(whole_groups_refusal("-np", np, job.group_size, f"job {job_id} trains in"))
        job.max_np = np
        return job

    def end(self, job: PoolJob, state: str, message: str, now: float) -> None:
        job.state, job.message, job.reason, job.ended_at = state, message, message, now
        job.placement = {}
        job.sized(now)

    def live(self) -> list[PoolJob]:
        return [j for j in self.jobs.values() if j.state in LIVE]

    def _forget_old(self) -> None:
        ended = [j for j in self.jobs.values() if j.state in ENDED]
        for job in sorted(ended, key=lambda j: j.ended_at or 0)[:max(0, len(ended) - KEEP_ENDED)]:
            del self.jobs[job.id]
            self.forgotten.append(job.id)
