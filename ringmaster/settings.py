"""Settings of Ringmaster: frozen, validated models with documented defaults, one place for all.

`JobSettings` is what `ringmaster run` and `ringmaster serve` were asked to do; `AgentSettings`
is a host agent's (`ringmaster agent`, and the agents `run` starts). Both take their defaults
from the constants below, so a timeout the two share is given once. README.md lists them.
The other parts take their defaults from here too; this module imports none of them.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Seconds the job waits below --min-np before it fails (Horovod's default).
DEFAULT_ELASTIC_TIMEOUT_S = 600.0
#: Seconds between two runs of the discovery script.
DEFAULT_DISCOVERY_INTERVAL_S = 1.0
#: Seconds a discovery script may run before it is killed and the attempt counts as failed.
DEFAULT_DISCOVERY_TIMEOUT_S = 10.0
#: Seconds between heartbeats of agents and workers.
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0
#: Seconds without a heartbeat after which an agent (host) or worker counts as dead.
DEFAULT_HEARTBEAT_TIMEOUT_S = 10.0
#: Seconds a worker whose process its agent sees running (busy: importing, building its model,
#: a long C call holding the interpreter) may go without a heartbeat of its own before it counts
#: as hung; a stopped, exited or zombie process counts as dead after --heartbeat-timeout.
DEFAULT_BUSY_TIMEOUT_S = 120.0
#: Seconds a collective may take before the worker gives its generation up (a hung peer).
DEFAULT_COLLECTIVE_TIMEOUT_S = 30.0
#: Seconds an agent or a worker keeps trying to reach a lost rendezvous before it gives up
#: (workers read it from RINGMASTER_RECONNECT_TIMEOUT).
DEFAULT_RECONNECT_TIMEOUT_S = 300.0
#: Seconds the first generation waits for every discovered host's agent to connect.
DEFAULT_START_TIMEOUT_S = 30.0
#: Seconds a stopped worker gets between SIGTERM and SIGKILL.
DEFAULT_STOP_GRACE_S = 5.0
#: Seconds an operator's drain (`ringmaster drain`) gives the host's workers to reach a commit.
DEFAULT_DRAIN_DEADLINE_S = 300.0
#: Seconds an agent that gets SIGTERM keeps its workers for them to leave at a commit: under
#: Kubernetes' default terminationGracePeriodSeconds (30).
DEFAULT_DRAIN_GRACE_S = 25.0
#: Seconds between two runs of an agent's preemption notice script (AWS advises polling every 5 s).
DEFAULT_NOTICE_INTERVAL_S = 5.0
#: Warm spare worker processes per agent (0: none); see worker/agent/starting/spare_pool.py.
DEFAULT_SPARES = 1
#: Size (MiB) at which the timeline file (--timeline) is rotated to FILE.1.
DEFAULT_TIMELINE_MAX_MB = 64
#: Environment variables that give the timeline file when --timeline is not given (the first set wins).
TIMELINE_ENV = ("RINGMASTER_TIMELINE", "HOROVOD_TIMELINE")
SPARES_ENV = "RINGMASTER_SPARES"  # where --spares takes its default from
FORK_WORKERS_ENV = "RINGMASTER_FORK_WORKERS"  # "0": agents start every worker fresh (--no-fork-workers)
MAX_SPARES = 64
#: Seconds a ready newcomer waits for the other newcomers still warming up, so that they join
#: the ring together in one reset.
DEFAULT_WARMUP_GRACE_S = 5.0
#: A generation that fails sooner than this after it formed counts towards a crash loop.
DEFAULT_CRASH_LOOP_WINDOW_S = 10.0
#: Consecutive quickly failing generations after which the job gives up.
DEFAULT_CRASH_LOOP_LIMIT = 5
#: Restarts of a plain job (one without `hvd.elastic.run`) after a worker failed, before the job
#: fails (torchrun's --max-restarts, whose default is 0 too; horovodrun fails on the first error).
DEFAULT_MAX_RESTARTS = 0
#: Seconds the next ring waits for the exit status of a worker whose connection closed, so that
#: a crashed worker's host is blacklisted before the ring re-forms (one failure, one reset).
DEFAULT_EXIT_REPORT_TIMEOUT_S = 5.0
#: Seconds one request to the rendezvous may take (Ready, Done, a worker's exit report): it
#: answers in milliseconds, so only a rendezvous that is gone or stopped reaches these.
RPC_TIMEOUT_S = 30.0
HEARTBEAT_RPC_TIMEOUT_S = 10.0
EXIT_REPORT_RPC_TIMEOUT_S = 5.0
#: Seconds the end of a job gives its agents, past --stop-grace, to stop their workers and exit;
#: and agents started elsewhere (`serve`) to receive the shutdown before the server stops.
AGENT_EXIT_GRACE_S = 5.0
REMOTE_AGENTS_SHUTDOWN_S = 0.5
#: Seconds `ringmaster scale` waits for the control API's answer.
API_CLIENT_TIMEOUT_S = 10.0
#: Durable checkpoints kept in --checkpoint-dir, and seconds between them when --checkpoint-dir
#: is given without --checkpoint-every/-interval.
DEFAULT_CHECKPOINT_KEEP = 3
DEFAULT_CHECKPOINT_INTERVAL_S = 60.0


#: The most workers one replica group may have (`--group-size`).
MAX_GROUP_SIZE = 4096
#: Most slots one host may offer (far above any machine's GPUs or sensible CPU workers): the
#: bound of discovery output, -H, and a pool agent's poll.
MAX_SLOTS_PER_HOST = 1024


def nearest_whole_groups(count: int, group_size: int) -> str:
    """The whole numbers of groups nearest `count` workers, as a refusal offers them: "2 or 4"."""
    below = count - count % group_size
    return " or ".join(str(n) for n in (below, below + group_size) if n > 0)


class JobSettings(BaseModel):
    """What `ringmaster run` / `ringmaster serve` were asked to do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: list[str] = Field(default_factory=list, description="the training command each worker runs")
    min_np: int = Field(1, ge=1, description="fewest workers the job trains with")
    max_np: Optional[int] = Field(None, ge=1, description="most workers; None means all discovered slots")
    group_size: int = Field(1, ge=1, le=MAX_GROUP_SIZE,
                            description="workers per replica group: the job grows and shrinks by whole groups of "
                                        "consecutive ranks, and a worker lost takes its group out (1: no groups)")
    elastic_timeout_s: float = Field(DEFAULT_ELASTIC_TIMEOUT_S, gt=0)
    reset_limit: Optional[int] = Field(None, ge=0, description="most resets before the job fails; None: no limit")
    max_restarts: int = Field(DEFAULT_MAX_RESTARTS, ge=0, le=1_000_000,
                              description="a plain job's restarts of all workers after a worker failed, before it "
                                          "fails")
    discovery_interval_s: float = Field(DEFAULT_DISCOVERY_INTERVAL_S, gt=0)
    discovery_timeout_s: float = Field(DEFAULT_DISCOVERY_TIMEOUT_S, gt=0)
    heartbeat_interval_s: float = Field(DEFAULT_HEARTBEAT_INTERVAL_S, gt=0)
    heartbeat_timeout_s: float = Field(DEFAULT_HEARTBEAT_TIMEOUT_S, gt=0)
    heartbeat_relay: Literal["auto", "always", "never"] = Field(
        "auto", description="workers send heartbeats to their host's agent, which carries them in its own: 'auto' when "
                            "the job has more workers than the rendezvous takes beats from (heartbeat_pace.py)")
    reconnect_timeout_s: float = Field(
        DEFAULT_RECONNECT_TIMEOUT_S, gt=0,
        description="how long the parts of a job wait for each other across a partition: agents and workers keep "
                    "trying to reach a lost rendezvous (then agents stop their workers), and a rendezvous that hears "
                    "from no host at all waits for them before counting them lost")
    busy_timeout_s: float = Field(
        DEFAULT_BUSY_TIMEOUT_S, gt=0,
        description="how long a worker whose process its agent sees running may go without a heartbeat of its own "
                    "(a busy interpreter: imports, a long C call) before it counts as hung; never blacklists its host")
    elastic: bool = Field(
        False, description="the job is elastic from its launch (--min-np below --max-np, a discovery script, -H with "
                           "--min-np, --hosts-from-agents, a pool's job, the Ray executor): a worker's failure before "
                           "any worker entered hvd.elastic.run re-forms the ring without it instead of restarting "
                           "every worker (--max-restarts is a plain job's)")
    collective_timeout_s: float = Field(DEFAULT_COLLECTIVE_TIMEOUT_S, gt=0)
    start_timeout_s: float = Field(DEFAULT_START_TIMEOUT_S, gt=0)
    stop_grace_s: float = Field(DEFAULT_STOP_GRACE_S, ge=0)
    spares: int = Field(DEFAULT_SPARES, ge=0, le=MAX_SPARES,
                        description="warm spare worker processes each agent that `run` starts keeps ready (0: none)")
    # What the agents `run` starts do on SIGTERM and with preemption notices (worker/agent/notice.py).
    drain_grace_s: float = Field(DEFAULT_DRAIN_GRACE_S, gt=0, le=86_400)
    notice_script: Optional[str] = None
    notice_interval_s: float = Field(DEFAULT_NOTICE_INTERVAL_S, ge=0.1, le=3600)
    blacklist_cooldown_s: Optional[tuple[float, float]] = None
    stragglers: Literal["report", "replace"] = Field(
        "report", description="a host whose ranks are slower than the others' (see straggler_slowdown): report "
                              "it (an event, a metric), or replace it: drain it at a commit and take another host, "
                              "where that makes the job faster")
    straggler_slowdown: float = Field(1.2, gt=1.0, le=100.0,
                                      description="how many times slower than the other hosts' ranks a host's are, "
                                                  "at least, to be a straggler")
    straggler_steps: int = Field(50, ge=5, le=100_000, description="over each rank's last this many steps")
    hosts_from_agents: bool = Field(
        False, description="every agent that proves the job secret joins the job as its host, with the slots it "
                           "declares, and leaves it when it goes (Kubernetes, Slurm, any engine that starts agents)")
    warmup_grace_s: float = Field(DEFAULT_WARMUP_GRACE_S, ge=0)
    crash_loop_window_s: float = Field(DEFAULT_CRASH_LOOP_WINDOW_S, ge=0)
    crash_loop_limit: int = Field(DEFAULT_CRASH_LOOP_LIMIT, ge=1)
    exit_report_timeout_s: float = Field(DEFAULT_EXIT_REPORT_TIMEOUT_S, ge=0)
    spare_last_hosts: bool = Field(
        True, description="a host whose worker was killed by a signal, or that was lost, stays when blacklisting "
                          "it would leave fewer than min_np slots (the job restarts there); False: Horovod's rule")
    checkpoint_dir: Optional[str] = Field(None, description="folder of durable checkpoints (absolute); None: "
                                                            "in-memory commits only")
    checkpoint_every: Optional[int] = Field(None, ge=1, description="write a checkpoint every N commits")
    checkpoint_interval_s: Optional[float] = Field(None, gt=0, description="or every T seconds")
    checkpoint_keep: int = Field(DEFAULT_CHECKPOINT_KEEP, ge=1)
    checkpoint_trusted: bool = Field(
        False, description="load checkpoints as full pickles (objects of any class): only for a folder that nobody "
                           "but the job can write; False: tensors, numbers, strings and containers only")
    timeline: Optional[str] = Field(None, max_length=4096,
                                    description="file the job's Chrome trace timeline is written to; None: no timeline")
    timeline_max_mb: int = Field(DEFAULT_TIMELINE_MAX_MB, ge=1, le=1 << 20,
                                 description="size at which the timeline file is rotated to FILE.1")
    fusion_threshold_bytes: Optional[int] = Field(None, ge=0, le=1 << 40,
                                                  description="bytes fused into one allreduce, set for the workers "
                                                              "(--fusion-threshold-mb); None: their environment's")

    @model_validator(mode="after")
    def _check(self) -> "JobSettings":
        if self.max_np is not None and self.max_np < self.min_np:
            raise ValueError(f"--max-np ({self.max_np}) must be at least --min-np ({self.min_np})")
        for flag, count in (("--min-np", self.min_np), ("--max-np", self.max_np)):
            if count is not None and count % self.group_size:
                raise ValueError(f"{flag} {count} is not a whole number of groups of --group-size {self.group_size}: "
                                 f"give {nearest_whole_groups(count, self.group_size)}")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"--heartbeat-timeout ({self.heartbeat_timeout_s:g} s) must exceed the heartbeat interval "
                f"({self.heartbeat_interval_s:g} s)"
            )
        if self.checkpoint_dir is None and (self.checkpoint_every is not None
                                            or self.checkpoint_interval_s is not None):
            raise ValueError("--checkpoint-every and --checkpoint-interval need --checkpoint-dir DIR")
        return self


class AgentSettings(BaseModel):
    """What a host agent was asked to do (`ringmaster agent`; `ringmaster run` starts its agents
    with the job's heartbeat interval and stop grace)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rendezvous: list[str] = Field(min_length=1, description="HOST:PORT of every rendezvous of the job (leader and "
                                                            "standbys)")
    host: str = Field(min_length=1, description="this host's name as discovery lists it")
    heartbeat_interval_s: float = Field(DEFAULT_HEARTBEAT_INTERVAL_S, gt=0)
    stop_grace_s: float = Field(DEFAULT_STOP_GRACE_S, ge=0)
    reconnect_timeout_s: float = Field(DEFAULT_RECONNECT_TIMEOUT_S, gt=0)
    spares: int = Field(DEFAULT_SPARES, ge=0, le=MAX_SPARES,
                        description="warm spare worker processes kept ready (0: none)")
    slots: int = Field(1, ge=1, le=1024,  # (discovery.MAX_SLOTS_PER_HOST)
                       description="slots this host offers a job that takes hosts from agents")
    fork_workers: bool = Field(True, description="fork the workers from one warm template process "
                                                 "(worker/agent/template.py) where their command allows, instead of "
                                                 "starting each fresh")
    warm_join: bool = Field(False, description="warm the spares for every slot before saying hello, so the first "
                                               "workers this host is given start warm")
    drain_grace_s: float = Field(DEFAULT_DRAIN_GRACE_S, gt=0, le=86_400,
                                 description="seconds the workers get to leave at a commit after SIGTERM")
    notice_script: str | None = Field(None, description="a preemption notice script, run every notice_interval_s")
    notice_interval_s: float = Field(DEFAULT_NOTICE_INTERVAL_S, ge=0.1, le=3600)
