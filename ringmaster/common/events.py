"""Structured events: one typed record per meaningful happening, rendered as text or JSON.

Every part of Ringmaster says what happened as an `Event` (a kind, the generation and typed
fields) and logs it through standard `logging` (`log_event`); the console line is rendered
from the kind's template, the JSON line carries the fields as they are. Metrics, the events
API, the timeline and tests consume kinds and fields, never the wording, so the wording can
change without breaking them.
"""

from __future__ import annotations

import enum
import logging
import math
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


class Kind(enum.StrEnum):
    """What happened. The value (`area.what`) is what JSON lines and the events API carry."""

    # rendezvous: hosts and discovery
    HOSTS_DISCOVERED = "hosts.discovered"
    HOSTS_CHANGED = "hosts.changed"
    DISCOVERY_FAILED = "discovery.failed"
    HOST_LOST = "host.lost"
    HOST_UNREACHABLE = "host.unreachable"
    AGENT_LAUNCHING = "agent.launching"
    HOST_LEFT = "host.left"
    HOST_BLACKLISTED = "host.blacklisted"
    HOST_SPARED = "host.spared"
    HOST_KEPT_FOR_COMMIT = "host.kept_for_commit"
    HOST_DRAINING = "host.draining"
    HOST_DRAINED = "host.drained"
    HOST_UNDRAINED = "host.undrained"
    STRAGGLER_FOUND = "host.straggler"
    HOSTS_UPDATED = "hosts.updated"
    HOSTS_ANNOUNCED = "hosts.announced"
    SLOTS_SHORT = "slots.short"
    # rendezvous: agents and workers
    AGENT_CONNECTED = "agent.connected"
    AGENT_RECONNECTED = "agent.reconnected"
    AGENT_VERSION_DIFFERS = "agent.version_differs"
    WORKER_STARTING = "worker.starting"
    WORKER_CONNECTED = "worker.connected"
    WORKER_READY = "worker.ready"
    WORKER_RETURNED = "worker.returned"
    WORKER_WARNING = "worker.warning"
    WORKER_FAILED = "worker.failed"
    WORKER_EXITED = "worker.exited"
    WORKER_STOPPED = "worker.stopped"
    WORKER_FINISHED = "worker.finished"
    WORKER_RETIRING = "worker.retiring"
    # rendezvous: generations and the job
    GENERATION_FORMED = "generation.formed"
    GENERATION_OVER = "generation.over"
    SCALE_REQUESTED = "scale.requested"
    JOB_FINISHING = "job.finishing"
    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_STOPPED = "job.stopped"
    JOB_RESUMED = "job.resumed"
    JOB_RECOVERED = "job.recovered"
    JOB_PROGRESS = "job.progress"
    JOB_SUMMARY = "job.summary"
    JOB_WARNING = "job.warning"
    JOB_SECRET_SAVED = "job.secret_saved"
    JOB_PREVIOUS_ENDED = "job.previous_ended"
    COMMITS_LOST = "commits.lost"
    RENDEZVOUS_STALLED = "rendezvous.stalled"
    RENDEZVOUS_ISOLATED = "rendezvous.isolated"
    RENDEZVOUS_REJOINED = "rendezvous.rejoined"
    RENDEZVOUS_LISTENING = "rendezvous.listening"
    API_LISTENING = "api.listening"
    EVENT_LOOP_ERROR = "rendezvous.loop_error"
    CALL_REFUSED = "rendezvous.call_refused"
    PEER_LIMITED = "rendezvous.peer_limited"
    TIMELINE_FAILED = "timeline.failed"
    TIMELINE_WRITTEN = "timeline.written"
    # durable state and leadership
    LEADER_STANDING_BY = "leader.standing_by"
    LEADER_LEADING_ON = "leader.leading_on"
    LEADER_DEPOSED = "leader.deposed"
    STORE_FAILOVER = "store.failover"
    STORE_DEGRADED = "store.degraded"
    STORE_RECOVERED = "store.recovered"
    STORE_LEASE_EXPIRED = "store.lease_expired"
    STORE_CLEANUP_FAILED = "store.cleanup_failed"
    AGENT_LEASE_FAILED = "store.agent_lease_failed"
    STORE_UNREADABLE = "store.unreadable"
    # agent
    AGENT_SESSION = "agent.session"
    AGENT_WARM = "agent.warm"
    JOB_PREEMPTED = "job.preempted"
    JOB_REQUEUED = "job.requeued"
    # the pool (`ringmaster pool serve`): its hosts and the jobs it schedules
    POOL_LISTENING = "pool.listening"
    POOL_HOSTS = "pool.hosts"
    POOL_TAKEN_UP = "pool.taken_up"
    POOL_DEPOSED = "pool.deposed"
    POOL_HOST_BLACKLISTED = "pool.host_blacklisted"
    POOL_JOB_SUBMITTED = "pool.job_submitted"
    POOL_JOB_STARTED = "pool.job_started"
    POOL_JOB_RESIZED = "pool.job_resized"
    POOL_JOB_SUSPENDING = "pool.job_suspending"
    POOL_JOB_SUSPENDED = "pool.job_suspended"
    POOL_JOB_ENDED = "pool.job_ended"
    POOL_AGENT_JOINED = "pool.agent_joined"
    POOL_HOST_AGENT_STARTING = "pool.host_agent_starting"
    POOL_HOST_AGENT_ENDED = "pool.host_agent_ended"
    POOL_HOST_LAPSED = "pool.host_lapsed"
    POOL_STALLED = "pool.stalled"
    POOL_AGENT_STARTS = "pool.agent_starts"
    POOL_AGENT_STOPS = "pool.agent_stops"
    POOL_AGENT_TROUBLE = "pool.agent_trouble"
    AGENT_REFUSED = "agent.refused"
    AGENT_UNPROVEN = "agent.unproven"
    AGENT_REPORT_REFUSED = "agent.report_refused"
    AGENT_LOST_RENDEZVOUS = "agent.lost_rendezvous"
    AGENT_GAVE_UP = "agent.gave_up"
    AGENT_STOPPING = "agent.stopping"
    AGENT_DRAINING = "agent.draining"
    AGENT_DRAIN_REFUSED = "agent.drain_refused"
    AGENT_NOTICE = "agent.notice"
    AGENT_NOTICE_FAILED = "agent.notice_failed"
    AGENT_LEFTOVERS_REMOVED = "agent.leftovers_removed"
    AGENT_READY_REFUSED = "agent.ready_refused"
    PROCESS_STARTED = "process.started"
    PROCESS_START_FAILED = "process.start_failed"
    SPARE_READY = "spare.ready"
    SPARE_USED = "spare.used"
    SPARE_UNFIT = "spare.unfit"
    SPARE_TOO_BIG = "spare.too_big"
    SPARE_OFF = "spare.off"
    TEMPLATE_READY = "template.ready"
    TEMPLATE_FORKED = "template.forked"
    TEMPLATE_LATE_FORK = "template.late_fork"
    TEMPLATE_UNFIT = "template.unfit"
    TEMPLATE_OFF = "template.off"
    # worker (the training library)
    RING_JOINED = "ring.joined"
    RING_JOIN_FAILED = "ring.join_failed"
    PLANNED_GENERATION_MISSED = "ring.planned_missed"
    ROLLED_BACK = "state.rolled_back"
    REPLICAS_DIVERGED = "replicas.diverged"
    REPLICAS_HEALED = "replicas.healed"
    CHECKPOINT_RESUMED = "checkpoint.resumed"
    CHECKPOINT_IGNORED = "checkpoint.ignored"
    CHECKPOINT_PARTIAL = "checkpoint.partial"
    CHECKPOINT_WRITE_FAILED = "checkpoint.write_failed"
    CHECKPOINT_WRITTEN = "checkpoint.written"
    CHECKPOINT_SKIPPED = "checkpoint.skipped"
    LINK_LOST = "link.lost"
    LINK_UNREACHABLE = "link.unreachable"
    WORKER_LEAVING = "worker.leaving"
    WORKER_JOB_ENDED = "worker.job_ended"
    WORKER_ERROR = "worker.error"


@dataclass(frozen=True)
class Spec:
    level: int
    text: str  # a str.format template over the fields (see _TextFormatter for the extra specs)


_I, _W, _E, _D = logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG

#: Level and console wording of every kind.
SPECS: dict[Kind, Spec] = {
    Kind.HOSTS_DISCOVERED: Spec(_I, "discovered hosts {hosts:hosts}"),
    Kind.HOSTS_CHANGED: Spec(_I, "discovery: {description}"),
    Kind.DISCOVERY_FAILED: Spec(_W, "discovery failed, keeping the last good host set: {error}"),
    Kind.HOST_LOST: Spec(_W, "host {host} lost: its agent {reason}"),
    Kind.HOST_UNREACHABLE: Spec(_E, "host {host} is unreachable: {reason}"),
    Kind.AGENT_LAUNCHING: Spec(_I, "starting the agent of {host} {how}"),
    Kind.HOST_LEFT: Spec(_I, "agent for host {host} stopped: the host left the job"),
    Kind.HOST_BLACKLISTED: Spec(_W, "host {host} blacklisted {cooldown_s:cooldown} after a failure ({why})"),
    Kind.HOST_SPARED: Spec(_I, "host {host} is not blacklisted: without it fewer than --min-np {min_np} slots remain "
                               "(--spare-last-hosts)"),
    Kind.HOST_KEPT_FOR_COMMIT: Spec(_W, "host {host} is not blacklisted after {why}: its workers {workers:list} "
                                        "hold the job's last commit, which no other worker holds yet (newcomers "
                                        "still receiving it); blacklisting it would have lost the committed steps"),
    Kind.HOST_DRAINING: Spec(_I, "draining host {host} ({why}): its workers leave at their next commit, within "
                                 "{deadline_s:g} s"),
    Kind.HOST_DRAINED: Spec(_I, "host {host} drained in {seconds:.2f} s: {how}"),
    Kind.HOST_UNDRAINED: Spec(_I, "host {host} is back in the job ({why})"),
    Kind.STRAGGLER_FOUND: Spec(_W, "host {host} is a straggler: its ranks take {pace_s:.3f} s per step besides waiting "
                                   "for the ring, {slowdown:.2f}x the other hosts' {others_s:.3f} s (over their last "
                                   "{steps} steps); {action}"),
    Kind.HOSTS_UPDATED: Spec(_I, "hosts updated ({reason}); workers re-form the ring at their next commit"),
    Kind.HOSTS_ANNOUNCED: Spec(_I, "the ring will grow ({reason}); workers train on until the newcomers are ready"),
    Kind.SLOTS_SHORT: Spec(_W,
                           "only {capacity} slot(s) available, --min-np is {min_np}; waiting up to {timeout_s:g} s"),
    Kind.AGENT_CONNECTED: Spec(_I, "agent for host {host} connected (pid {pid})"),
    Kind.AGENT_RECONNECTED: Spec(_I, "agent for host {host} reconnected (pid {pid})"),
    Kind.AGENT_VERSION_DIFFERS: Spec(_W, "the agent of host {host} runs Ringmaster {agent_version}, the rendezvous "
                                         "{version}; install one version on every host (`ringmaster --version`)"),
    Kind.WORKER_STARTING: Spec(_I, "starting worker {worker} on {host} (joins after warming up)"),
    Kind.WORKER_CONNECTED: Spec(_D, "worker {worker} connected (pid {pid})"),
    Kind.WORKER_READY: Spec(_D, "worker {worker} ready for the generation after {after_generation}{failure:paren}"),
    Kind.WORKER_RETURNED: Spec(_I, "worker {worker} finished its training function"),
    Kind.WORKER_WARNING: Spec(_W, "worker {worker}: {warning}"),
    Kind.WORKER_FAILED: Spec(_W, "worker {worker} on {host} failed: {reason}"),
    Kind.WORKER_EXITED: Spec(_W, "worker {worker} on {host} {how}"),
    Kind.WORKER_STOPPED: Spec(_I, "worker {worker} on {host} stopped ({how})"),
    Kind.WORKER_FINISHED: Spec(_I, "worker {worker} on {host} finished ({how})"),
    Kind.WORKER_RETIRING: Spec(_I, "worker {worker} on {host} retires: {reason}"),
    Kind.GENERATION_FORMED: Spec(_I, "generation {number} formed: world size {size} on {hosts:hosts} (cause: {cause})"),
    Kind.GENERATION_OVER: Spec(_I, "generation {number} is over: {reason}"),
    Kind.SCALE_REQUESTED: Spec(_I, "scale to {np} workers requested"),
    Kind.JOB_FINISHING: Spec(_I, "training function returned; waiting for the other workers to finish"),
    Kind.JOB_SUCCEEDED: Spec(_I, "job succeeded: {reason}"),
    Kind.JOB_FAILED: Spec(_E, "job failed: {reason}"),
    Kind.JOB_STOPPED: Spec(_D, "job stopped: {reason}"),  # (the summary says it once)
    Kind.JOB_PROGRESS: Spec(_I, "generation {number}, world size {size}, {steps} steps committed, {rate:g} steps/s, "
                                "{since_reset_s:g} s since the last reset"),
    Kind.JOB_RECOVERED: Spec(_I, "training resumed {seconds:.2f} s after the failure was seen (rank 0's first commit "
                                 "in generation {number})"),
    Kind.JOB_RESUMED: Spec(_I, "resumed the job from the store: generation {number}, {live} live worker(s) on "
                               "{hosts} host(s) awaiting reconnection"),
    Kind.JOB_SUMMARY: Spec(_I, "job {outcome} after {seconds:.1f} s: {steps} steps committed{steps_lost:lost}, "
                               "{generations} generation(s), {resets} reset(s).{reason:lead}"),
    Kind.JOB_WARNING: Spec(_W, "WARNING: {warning}"),
    Kind.JOB_SECRET_SAVED: Spec(_I, "the job's secret is in {path} (yours alone): `ringmaster scale`, `status` and "
                                    "`events --api {url}` find it there"),
    Kind.JOB_PREVIOUS_ENDED: Spec(_I, "the job last run under {prefix} has ended ({outcome}); starting a new one"),
    Kind.COMMITS_LOST: Spec(_W, "every worker died and the job has no --checkpoint-dir: it restarts from its initial "
                                "state, and the {steps} step(s) committed so far are lost (pass --checkpoint-dir DIR "
                                "to resume from a durable checkpoint instead)"),
    Kind.RENDEZVOUS_ISOLATED: Spec(_W, "no heartbeat from any of the {hosts} hosts for {seconds:.1f} s: this "
                                       "rendezvous may be cut off from them; training goes on without it, waiting up "
                                       "to {wait_s:g} s (--reconnect-timeout) before counting them lost"),
    Kind.RENDEZVOUS_REJOINED: Spec(_I, "hosts are heard again after {seconds:.1f} s of silence"),
    Kind.RENDEZVOUS_STALLED: Spec(_W, "the rendezvous did not run for {seconds:.1f} s (stopped, swapped out or "
                                      "starved of CPU); hosts and workers are judged by the heartbeats that arrive "
                                      "from now on"),
    Kind.RENDEZVOUS_LISTENING: Spec(_I, "rendezvous listening on {address}; discovery: {discovery}; store: {store}"),
    Kind.API_LISTENING: Spec(_I, "control API on {url}"),
    Kind.CALL_REFUSED: Spec(_W, "refused a call of {method}: {reason} ({refused} refused so far)"),
    Kind.PEER_LIMITED: Spec(_W, "closed {count} gRPC connections of {peer}: one address may hold {limit}"),
    Kind.TIMELINE_FAILED: Spec(_W, "the timeline stopped: cannot write {error}; the job goes on without it"),
    Kind.TIMELINE_WRITTEN: Spec(_I, "timeline written to {path} ({megabytes:.1f} MB{rotated}); open it in "
                                    "chrome://tracing or ui.perfetto.dev"),
    Kind.EVENT_LOOP_ERROR: Spec(_W, "event loop: {error}{repeats:repeats}"),
    Kind.LEADER_STANDING_BY: Spec(_I,
                                  "standing by: the rendezvous at {leader} leads this job; taking over if it stops"),
    Kind.LEADER_LEADING_ON: Spec(_W, "the leader lease had run out but no other rendezvous took the job: leading on"),
    Kind.LEADER_DEPOSED: Spec(_W, "stopped leading the job: {reason}"),
    Kind.STORE_FAILOVER: Spec(_W, "etcd at {previous} did not answer ({error}); now using etcd at {endpoint}"),
    Kind.STORE_DEGRADED: Spec(_W, "degraded: the store is unreachable ({error}); training goes on, membership changes "
                                  "wait until it is back"),
    Kind.STORE_RECOVERED: Spec(_I, "the store is reachable again; caught up"),
    Kind.STORE_LEASE_EXPIRED: Spec(_W, "the job's lease in the store expired; rewriting every key"),
    Kind.STORE_CLEANUP_FAILED: Spec(_W, "could not remove the finished job's keys: {error}; they expire within "
                                        "{ttl_s} s"),
    Kind.AGENT_LEASE_FAILED: Spec(_W, "could not record the agent of {host} in the store: {error}"),
    Kind.STORE_UNREADABLE: Spec(_W, "skipped the store's key {key}: {error} ({count} skipped so far; was it written by "
                                    "something other than ringmaster?)"),
    Kind.AGENT_SESSION: Spec(_I, "session with the rendezvous at {address}"),
    Kind.JOB_PREEMPTED: Spec(_W, "the job is preempted ({reason}): every host drains, its workers leave at their "
                                 "next commit (made durable first) within {deadline_s:g} s"),
    Kind.JOB_REQUEUED: Spec(_W, "{how}"),
    Kind.POOL_LISTENING: Spec(_I, "pool of {slots} slot(s) on {hosts}, policy {policy}: control API at {url}"),
    Kind.POOL_HOSTS: Spec(_I, "the pool's hosts: {hosts} ({slots} slots)"),
    Kind.POOL_TAKEN_UP: Spec(_I, "took up {jobs} job(s) the store kept ({live} not ended; running ones resume from "
                                 "their last checkpoint)"),
    Kind.POOL_DEPOSED: Spec(_W, "stopped leading the pool: {reason}; its jobs resume under the new leader from their "
                                "last checkpoints"),
    Kind.POOL_HOST_BLACKLISTED: Spec(_W, "host {host} {why} under job {job}: out of the pool for {cooldown_s:g} s; "
                                         "every job on it is rescheduled"),
    Kind.POOL_JOB_SUBMITTED: Spec(_I, "job {job} queued in {queue} (priority {priority}, {min_np}-{max_np} workers)"),
    Kind.POOL_JOB_STARTED: Spec(_I, "job {job} {how} on {size} slot(s): {hosts}"),
    Kind.POOL_JOB_RESIZED: Spec(_I, "job {job}: {before} -> {size} slot(s) at its next commit ({hosts}): {reason}"),
    Kind.POOL_JOB_SUSPENDING: Spec(_W, "job {job} is suspended: {reason}"),
    Kind.POOL_JOB_SUSPENDED: Spec(_I, "job {job} suspended at a durable checkpoint; it resumes when slots come back"),
    Kind.POOL_JOB_ENDED: Spec(_I, "job {job} {state}: {outcome}"),
    Kind.POOL_AGENT_JOINED: Spec(_I, "host {host} joined the pool at {pool} with {slots} slot(s)"),
    Kind.POOL_HOST_AGENT_STARTING: Spec(_I, "host {host}: starting its pool agent {how}"),
    Kind.POOL_HOST_AGENT_ENDED: Spec(_W, "host {host}: its pool agent ended ({how}); out of the pool for "
                                         "{cooldown_s:g} s, then started again"),
    Kind.POOL_HOST_LAPSED: Spec(_W, "host {host} left the pool: its pool agent has not polled for {timeout_s:g} s "
                                    "(--host-timeout); its jobs count it lost"),
    Kind.POOL_STALLED: Spec(_W, "the pool did not run for {seconds:.1f} s (stopped, swapped out or starved of CPU); "
                                "its hosts' silence meanwhile is not counted against them"),
    Kind.POOL_AGENT_STARTS: Spec(_I, "host {host}: starts the agent of job {job} (rendezvous {rendezvous}; started "
                                     "ahead with warm spares: {warm})"),
    Kind.POOL_AGENT_STOPS: Spec(_I, "host {host}: stops the agent of job {job}: {why}"),
    Kind.POOL_AGENT_TROUBLE: Spec(_W, "host {host}: the pool did not answer ({error}); its jobs' agents go on, "
                                      "asking again in {retry_s:g} s"),
    Kind.AGENT_WARM: Spec(_I, "{spares} warm spare(s) for {slots} slot(s), worker template warm: {template}, in "
                              "{took_s:g} s; connecting"),
    Kind.AGENT_REFUSED: Spec(_E, "the rendezvous at {address} refused this agent: {error}"),
    Kind.AGENT_UNPROVEN: Spec(_E, "ignoring {address}: {error}"),
    Kind.AGENT_REPORT_REFUSED: Spec(_W, "the rendezvous refused the exit report of {worker}: {error}"),
    Kind.AGENT_LOST_RENDEZVOUS: Spec(_W, "lost the rendezvous at {address}; workers keep running, reconnecting"),
    Kind.AGENT_GAVE_UP: Spec(_E, "could not reach the rendezvous at {addresses} for {timeout_s:g} s "
                                 "(--reconnect-timeout); stopping workers"),
    Kind.AGENT_STOPPING: Spec(_I, "stopping: {reason}"),
    Kind.AGENT_DRAINING: Spec(_W, "{why}: draining this host; its {workers} worker(s) leave at their next commit, "
                                  "within {grace_s:g} s (send {why} again to stop them now)"),
    Kind.AGENT_DRAIN_REFUSED: Spec(_W, "the rendezvous refused this host's drain: {error}"),
    Kind.AGENT_NOTICE: Spec(_W, "preemption notice: {notice}"),
    Kind.AGENT_NOTICE_FAILED: Spec(_W, "the preemption notice script {problem}; no drain asked for"),
    Kind.AGENT_LEFTOVERS_REMOVED: Spec(_I, "removed {count} temporary folder(s) of agents no longer running"),
    Kind.AGENT_READY_REFUSED: Spec(_W, "the rendezvous refused the Ready of worker {worker} this agent carried: "
                                       "{reason}"),
    Kind.PROCESS_STARTED: Spec(_I, "starting worker {worker} (slot {slot}): {command}"),
    Kind.PROCESS_START_FAILED: Spec(_E, "cannot start worker {worker}: {error}; check the training command"),
    Kind.SPARE_READY: Spec(_I, "warm spare (pid {pid}) ready: its imports took {took_s:g} s"),
    Kind.SPARE_USED: Spec(_I, "worker {worker} runs in a spare (pid {pid}, started {age_s:g} s ago, warm: {warm})"),
    Kind.SPARE_UNFIT: Spec(_I, "worker {worker} starts fresh, not in a warm spare: {reason}"),
    Kind.SPARE_TOO_BIG: Spec(_W, "stopped a warm spare (pid {pid}) holding {rss_mb} MB, more than {limit_mb} MB"),
    Kind.TEMPLATE_READY: Spec(_I, "worker template (pid {pid}) ready: workers here are forked from it"),
    Kind.TEMPLATE_FORKED: Spec(_I, "worker {worker} forked from the worker template (pid {pid}, in {took_ms:g} ms)"),
    Kind.TEMPLATE_LATE_FORK: Spec(_W, "the worker template forked worker {worker} (pid {pid}) after it had been "
                                      "started fresh: that late copy was killed"),
    Kind.TEMPLATE_UNFIT: Spec(_I, "worker {worker} starts fresh, not forked from the worker template: {reason}"),
    Kind.TEMPLATE_OFF: Spec(_W, "no worker template on this host ({reason}): workers start fresh"),
    Kind.SPARE_OFF: Spec(_W, "no warm spares on this host: {failures} died before use (last: {reason}); workers start "
                             "fresh (start the agent with --spares 0 to not try)"),
    Kind.RING_JOINED: Spec(_I, "joined generation {generation} as rank {rank} of {size}: waited {waited_ms:.0f} ms for "
                               "the ring, built it in {built_ms:.0f} ms, synced state in {sync_ms:.0f} ms, reset "
                               "callbacks {callbacks_ms:.0f} ms, {check} (rank {root}'s commit, the "
                               "newest, went to {synced_to:ranks})"),
    Kind.RING_JOIN_FAILED: Spec(_W, "could not join generation {generation}: {error}"),
    Kind.PLANNED_GENERATION_MISSED: Spec(_I, "generation {generation} ended before this worker joined it ({reason}): "
                                             "it joins the next one as a newcomer"),
    Kind.ROLLED_BACK: Spec(_W, "rolled back to commit {commit} after: {failure}"),
    Kind.REPLICAS_DIVERGED: Spec(_W, "replica guard: in generation {generation} the live state differs from rank 0's "
                                     "after the sync ({differences}); syncing every rank from rank 0's live state"),
    Kind.REPLICAS_HEALED: Spec(_I, "replica guard: every rank holds rank 0's state again in generation {generation}"),
    Kind.CHECKPOINT_RESUMED: Spec(_I, "resumed from the checkpoint of step {step} in {directory} (written by "
                                      "{world_size} worker(s) in generation {written_in})"),
    Kind.CHECKPOINT_IGNORED: Spec(_W, "checkpoint of step {step} in {directory} holds no state dict; ignored"),
    Kind.CHECKPOINT_PARTIAL: Spec(_W,
                                  "checkpoint of step {step} lacks {missing:list}: those keep their initial values"),
    Kind.CHECKPOINT_WRITE_FAILED: Spec(_W, "{error}"),
    Kind.CHECKPOINT_WRITTEN: Spec(_I, "{detail}"),
    Kind.CHECKPOINT_SKIPPED: Spec(_W, "{reason}"),
    Kind.LINK_LOST: Spec(_W, "lost the rendezvous at {address} ({reason}); training goes on, reconnecting"),
    Kind.LINK_UNREACHABLE: Spec(_E, "cannot reach the rendezvous at {address}: {code}; is `ringmaster run`/`serve` "
                                    "still running?"),
    Kind.WORKER_LEAVING: Spec(_I, "leaving the job: {reason}"),
    Kind.WORKER_JOB_ENDED: Spec(_I, "the job ended: {reason}"),
    Kind.WORKER_ERROR: Spec(_E, "{error}"),
}


class _TextFormatter(string.Formatter):
    """str.format with a few specs for the shapes events carry: `hosts` ({a: 2} -> "a:2"),
    `list`, `paren` (" (x)" or nothing), `cooldown` ("for 2.0 s" or "permanently"),
    `repeats` (" (N more like it ...)" or nothing), `ranks` ("ranks 1, 2" or "no rank"), `lost` (" (N more lost ...)" or
    nothing)."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "hosts":
            return ",".join(f"{h}:{s}" for h, s in dict(value).items()) or "(none)"
        if format_spec == "list":
            return ", ".join(str(v) for v in value)
        if format_spec == "lead":
            return f" {value}" if value else ""
        if format_spec == "paren":
            return f" ({value})" if value else ""
        if format_spec == "cooldown":
            return "permanently" if value is None or value == math.inf else f"for {value:.1f} s"
        if format_spec == "ranks":
            return ("ranks " + ", ".join(str(v) for v in value)) if value else "no rank"
        if format_spec == "lost":
            return f" ({value} more lost to restarts without a checkpoint)" if value else ""
        if format_spec == "repeats":
            return f" ({value[0]} more like it in the last {value[1]:g} s)" if value and value[0] else ""
        return super().format_field(value, format_spec)


_TEXT = _TextFormatter()


#: Keys of a JSON line that no event field may take.
RESERVED_FIELDS = frozenset({"kind", "generation", "time", "logger", "level", "message"})


@dataclass(frozen=True)
class Event:
    """One meaningful happening: its kind, the job's generation then (None where the teller does
    not know it), when (the teller's clock) and typed fields (JSON-able values)."""

    kind: Kind
    fields: Mapping[str, Any] = field(default_factory=dict)
    generation: int | None = None
    time: float = 0.0
    level_override: int | None = None  # where one kind is news at two levels (a job's summary)

    @property
    def level(self) -> int:
        return self.level_override if self.level_override is not None else SPECS[self.kind].level

    @property
    def message(self) -> str:
        """The console wording (without the `[gen N]` prefix); `{generation}` in a template is the
        event's own."""
        return _TEXT.format(SPECS[self.kind].text, **{"generation": self.generation, **self.fields})

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON lines and the events API carry it (the time is the logger's)."""
        return {"kind": self.kind.value, "generation": self.generation, **_jsonable(self.fields)}


def _jsonable(fields: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = None  # inf (a permanent blacklist) has no JSON form
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


def log_event(logger: logging.Logger | logging.LoggerAdapter, event: Event) -> None:
    """Log `event` at its kind's level; handlers find the record under `record.event`. Its
    message is worded only when the logger takes that level (as `Logger.log` would decide): a
    large job's change words tens of thousands of events at levels nobody logs."""
    level = event.level
    if logger.isEnabledFor(level):
        logger.log(level, event.message, extra={"event": event})


def emitter(logger_name: str) -> Callable[..., None]:
    """`say(kind, **fields)` for a module that tells its events to one logger."""
    logger = logging.getLogger(logger_name)

    def say(kind: Kind, **fields: Any) -> None:
        log_event(logger, Event(kind, fields))

    return say
