"""The flags of a job: what `ringmaster run` and `ringmaster serve` take (horovodrun's elastic flags
with Horovod's meaning, and torchrun's where they meet), grouped as --help lists them."""

from __future__ import annotations

import argparse

from ringmaster import settings as defaults
from ringmaster.common import logs
from ringmaster.common.secret import SECRET_ENV
from ringmaster.rendezvous.state.url import STORE_PASSWORD_ENV


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag of a job, then its command."""
    _size_and_host_flags(parser)
    _failure_and_log_flags(parser)
    _timing_flags(parser)
    _checkpoint_and_trace_flags(parser)
    _service_flags(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command, e.g. python train.py")



def _size_and_host_flags(parser: argparse.ArgumentParser) -> None:
    """How many workers, in what groups, on which hosts."""
    parser.add_argument("-np", "--num-proc", dest="np", type=int, default=None, metavar="N",
                        help="number of workers to start with; also the default of --min-np (and of --max-np without "
                             "discovery) (default: none)")
    parser.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, default=None,
                        metavar="N", help="fewest workers the job trains with (default: -np, else 1)")
    parser.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, default=None, metavar="N",
                        help="most workers (default: all slots with a discovery script or with -H and --min-np, as "
                             "horovodrun's elastic mode; else -np)")
    parser.add_argument("--group-size", type=int, default=1, metavar="K",
                        help="workers per replica group, for models sharded inside a group (FSDP2 on the group's "
                             "mesh: hvd.elastic.replica_group()) and replicated across groups: the job grows and "
                             "shrinks by whole groups of K consecutive ranks, and a worker lost takes its whole group "
                             "out of the next ring; --min-np and --max-np count workers, whole groups of them "
                             "(default: 1, no groups)")
    parser.add_argument("-H", "--hosts", default=None, metavar="HOST:SLOTS,...",
                        help="fixed hosts, e.g. 'node1:2,node2:2' (default: localhost with -np slots)")
    parser.add_argument("--hostfile", default=None, metavar="FILE",
                        help="fixed hosts from a file, one 'host slots=N' (horovodrun's and MPI's form) or 'host:N' "
                             "per line (default: none)")
    parser.add_argument("--host-discovery-script", default=None, metavar="PATH",
                        help="executable printing one 'host:slots' (or 'host' with --slots-per-host) per line; polled "
                             "every --discovery-interval (default: none)")
    parser.add_argument("--hosts-from-agents", action="store_true",
                        help="every agent that proves the job secret joins the job as its host, with the slots it "
                             "declares (`ringmaster agent --slots N`), and leaves it when it exits, drains or is "
                             "lost: how Kubernetes, Slurm or any engine scales a job, by starting and stopping "
                             "agents; with -H or a discovery script, their hosts too (default: off)")
    parser.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int, default=None, metavar="N",
                        help="slots of a host listed without a count (default: none; then each line needs host:slots)")


def _failure_and_log_flags(parser: argparse.ArgumentParser) -> None:
    """What the job does with failures, stragglers and resets, and how it logs."""
    parser.add_argument("--elastic-timeout", type=float, metavar="S", default=defaults.DEFAULT_ELASTIC_TIMEOUT_S,
                        help="seconds to wait below --min-np before failing (default: %(default)s)")
    parser.add_argument("--reset-limit", type=int, default=None,
                        metavar="N", help="most resets (ring re-formations) before the job fails (default: no limit)")
    parser.add_argument("--max-restarts", type=int, default=defaults.DEFAULT_MAX_RESTARTS, metavar="N",
                        help="a plain script (without hvd.elastic.run) whose worker fails is restarted as a whole, "
                             "from its first step unless it loads a checkpoint, at most N times before the job fails "
                             "(torchrun's flag; elastic jobs roll back instead, see --reset-limit). A job is elastic "
                             "from its launch with --min-np below --max-np, a discovery script, -H with --min-np or "
                             "--hosts-from-agents: a failure before hvd.elastic.run re-forms the ring without the "
                             "failed worker, as later (default: %(default)s)")
    parser.add_argument("--blacklist-cooldown-range", type=float, nargs=2, metavar=("MIN", "MAX"), default=None,
                        help="a failed host may return after MIN seconds, doubling per failure up to MAX (default: "
                             "blacklisted for good)")
    parser.add_argument("--stragglers", choices=("report", "replace"), default="report",
                        help="a host whose ranks take --straggler-slowdown times the other hosts' time per step "
                             "(besides waiting for the ring): report it (an event, the ringmaster_host_slowdown "
                             "metric), or replace it: drain it at a commit and take another host, where the job is "
                             "faster for it (default: report)")
    parser.add_argument("--straggler-slowdown", type=float, default=1.2, metavar="X",
                        help="how much slower a straggler's ranks are than the others' (default: 1.2)")
    parser.add_argument("--straggler-steps", type=int, default=50, metavar="N",
                        help="over each rank's last N steps (default: 50)")
    parser.add_argument("--spare-last-hosts", action=argparse.BooleanOptionalAction, default=True,
                        help="keep a host whose worker was killed by a signal (or that was lost) when blacklisting it "
                             "would leave fewer than --min-np slots: the job restarts there from its last commit or "
                             "checkpoint; --no-spare-last-hosts blacklists it as Horovod does (default: spare)")
    parser.add_argument("--exit-report-timeout", type=float, metavar="S",
                        default=defaults.DEFAULT_EXIT_REPORT_TIMEOUT_S,
                        help="seconds the next ring waits for a crashed worker's exit status before re-forming "
                             "without it (default: %(default)s)")
    parser.add_argument("--log-level", type=str.upper, choices=logs.LEVELS, default=None,
                        help="which events the rendezvous, agents and workers print: DEBUG adds workers' connections "
                             "and ready calls, INFO every event, WARNING failures and blacklisting, ERROR and "
                             f"CRITICAL only a failed job's end (default: ${logs.LOG_LEVEL_ENV}, else "
                             f"{logs.DEFAULT_LEVEL})")
    parser.add_argument("--verbose", dest="log_level", action="store_const", const="DEBUG",
                        help="horovodrun's flag: --log-level DEBUG (default: off)")
    parser.add_argument("--log-format", type=str.lower, choices=logs.FORMATS, default=None,
                        help="text: readable lines; json: one JSON object per line with the event's kind, generation "
                             f"and fields (default: ${logs.LOG_FORMAT_ENV}, else {logs.DEFAULT_FORMAT})")


def _timing_flags(parser: argparse.ArgumentParser) -> None:
    """Intervals, timeouts and graces (each default shown in --help and README.md)."""
    parser.add_argument("--discovery-interval", type=float, metavar="S", default=defaults.DEFAULT_DISCOVERY_INTERVAL_S,
                        help="seconds between discovery runs (default: %(default)s)")
    parser.add_argument("--discovery-timeout", type=float, metavar="S", default=defaults.DEFAULT_DISCOVERY_TIMEOUT_S,
                        help="seconds a discovery script may run (default: %(default)s)")
    parser.add_argument("--heartbeat-interval", type=float, metavar="S", default=defaults.DEFAULT_HEARTBEAT_INTERVAL_S,
                        help="seconds between agent and worker heartbeats; a job of more than 250 hosts or 1000 "
                             "workers stretches them, and --heartbeat-timeout alike (default: %(default)s)")
    parser.add_argument("--heartbeat-relay", choices=["auto", "always", "never"], default="auto",
                        help="workers send their heartbeats to their host's agent, which carries them in its own (one "
                             "call per host): auto when the job has more than 1000 workers (default: %(default)s)")
    parser.add_argument("--reconnect-timeout", type=float, metavar="S", default=defaults.DEFAULT_RECONNECT_TIMEOUT_S,
                        help="seconds the parts wait for each other across a partition: agents and workers keep "
                             "trying to reach a lost rendezvous, then agents stop their workers; a rendezvous that "
                             "hears from no host at all waits this long before counting them lost (default: "
                             "%(default)s)")
    parser.add_argument("--heartbeat-timeout", type=float, metavar="S", default=defaults.DEFAULT_HEARTBEAT_TIMEOUT_S,
                        help="seconds without a heartbeat before a host or worker counts as dead (default: "
                             "%(default)s)")
    parser.add_argument("--busy-timeout", type=float, metavar="S", default=defaults.DEFAULT_BUSY_TIMEOUT_S,
                        help="seconds a worker whose process its agent sees running (importing, a long C call holding "
                             "the interpreter) may go without a heartbeat of its own before it counts as hung; a "
                             "stopped or dead one counts after --heartbeat-timeout (default: %(default)s)")
    parser.add_argument("--collective-timeout", "--gloo-timeout-seconds",
                        dest="collective_timeout", type=float,
                        metavar="S", default=defaults.DEFAULT_COLLECTIVE_TIMEOUT_S,
                        help="seconds a collective may take before its generation is given up (default: %(default)s)")
    parser.add_argument("--start-timeout", type=float, metavar="S", default=defaults.DEFAULT_START_TIMEOUT_S,
                        help="seconds the first generation waits for every discovered host's agent (default: "
                             "%(default)s)")
    parser.add_argument("--stop-grace", type=float, metavar="S", default=defaults.DEFAULT_STOP_GRACE_S,
                        help="seconds between SIGTERM and SIGKILL when a worker is stopped (default: %(default)s)")
    parser.add_argument("--spares", type=int, metavar="N", default=None,
                        help="warm spare worker processes each agent keeps ready (torch imported), so a newcomer "
                             f"skips Python's and torch's start (default: ${defaults.SPARES_ENV}, else "
                             f"{defaults.DEFAULT_SPARES}; 0: none)")
    parser.add_argument("--warmup-grace", type=float, metavar="S", default=defaults.DEFAULT_WARMUP_GRACE_S,
                        help="seconds a ready newcomer waits for newcomers still warming up, to join in one reset "
                             "(default: %(default)s)")
    parser.add_argument("--crash-loop-limit", type=int, metavar="N", default=defaults.DEFAULT_CRASH_LOOP_LIMIT,
                        help="fail after this many generations in a row fail within --crash-loop-window (default: "
                             "%(default)s)")
    parser.add_argument("--crash-loop-window", type=float, metavar="S", default=defaults.DEFAULT_CRASH_LOOP_WINDOW_S,
                        help="seconds after forming within which a failing generation counts as a crash (default: "
                             "%(default)s)")


def _checkpoint_and_trace_flags(parser: argparse.ArgumentParser) -> None:
    """Durable checkpoints, the timeline, the data path's fusion."""
    parser.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                        help="folder where rank 0 writes durable checkpoints; a job started again on it resumes from "
                             "the newest good one (default: none)")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        metavar="N", help="write a checkpoint every N commits (default: see --checkpoint-interval)")
    parser.add_argument("--checkpoint-interval", type=float, default=None, metavar="S",
                        help=f"write a checkpoint every S seconds (default: {defaults.DEFAULT_CHECKPOINT_INTERVAL_S:g} "
                             "without --checkpoint-every)")
    parser.add_argument("--checkpoint-keep", type=int, default=defaults.DEFAULT_CHECKPOINT_KEEP, metavar="K",
                        help="checkpoints kept on disk (default: %(default)s)")
    parser.add_argument("--checkpoint-trusted", action="store_true",
                        help="load checkpoints that hold objects of any class (a full unpickle, which runs code from "
                             "the file): only for a folder nobody but this job can write (default: tensors, numbers, "
                             "strings, lists and dicts only)")
    parser.add_argument("--timeline", "--timeline-filename", dest="timeline", default=None, metavar="FILE",
                        help="write the job's timeline to FILE as a Chrome trace (chrome://tracing, ui.perfetto.dev): "
                             "a track per rank (forward, backward, allreduce buckets, optimizer step, commit, restore, "
                             "sync, ring build, waiting) and the rendezvous' generations, host changes and failures "
                             f"(default: ${defaults.TIMELINE_ENV[0]}, else ${defaults.TIMELINE_ENV[1]}, else none)")
    parser.add_argument("--fusion-threshold-mb", type=float, default=None, metavar="MB",
                        help="most megabytes of tensors fused into one allreduce (the optimizer's gradient buckets and "
                             "hvd's operation queue), as horovodrun's flag; 0: no fusion (default: "
                             "$HOROVOD_FUSION_THRESHOLD bytes, else 64)")
    parser.add_argument("--timeline-max-mb", type=int, default=defaults.DEFAULT_TIMELINE_MAX_MB, metavar="MB",
                        help="size at which the timeline file is renamed FILE.1 and a new one begun (default: "
                             "%(default)s)")


def _service_flags(parser: argparse.ArgumentParser) -> None:
    """The rendezvous' store, its addresses, TLS and the job secret."""
    parser.add_argument("--store", default="memory", metavar="URL",
                        help="where the rendezvous keeps the job's state: 'memory' (in this process) or "
                             "'etcd[s]://[USER@]HOST:PORT[,HOST:PORT...][/PREFIX]' (etcds: TLS; USER: etcd's "
                             "authentication, with --store-password-file; list every member of an etcd cluster: when "
                             "one stops answering the next is used); with etcd a restarted or standby `serve` takes "
                             "the job over (default: %(default)s; prefix default: /ringmaster/default)")
    parser.add_argument("--store-ca", default=None, metavar="FILE",
                        help="CA certificate that etcd's certificate must chain to, for an etcds:// store (default: "
                             "the system's)")
    parser.add_argument("--store-cert", default=None, metavar="FILE",
                        help="client certificate for an etcds:// store that asks for one (default: none)")
    parser.add_argument("--store-key", default=None, metavar="FILE", help="the key of --store-cert (default: none)")
    parser.add_argument("--store-password-file", default=None, metavar="FILE",
                        help=f"the password of --store's USER (mode 600; never in the URL, where every user of this "
                             f"machine can read it) (default: ${STORE_PASSWORD_ENV})")
    parser.add_argument("--bind", default=None, metavar="ADDR",
                        help="address the rendezvous and the rings' store listen on (default: --network-interface's "
                             "address; else, for `run` with hosts reached over ssh, this machine's address on the "
                             "route to the first of them; else 127.0.0.1)")
    parser.add_argument("--network-interface", "--network-interfaces", dest="network_interface", default=None,
                        metavar="NAME",
                        help="the interface the rendezvous, the rings' store and the Gloo/NCCL rings use, as "
                             "horovodrun's flag (GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME for the workers) (default: "
                             "none)")
    parser.add_argument("--advertise-address", default=None, metavar="HOST",
                        help="host name agents and workers dial (default: --bind, or this host's name when --bind is "
                             "0.0.0.0)")
    parser.add_argument("--port", type=int, default=0, metavar="P",
                        help="gRPC port of the rendezvous (default: a free one)")
    parser.add_argument("--api-port", type=int, default=0, metavar="P",
                        help="port of the HTTP control API (default: a free one)")
    parser.add_argument("--tls-cert", default=None, metavar="FILE",
                        help="serve gRPC and the control API over TLS with this certificate (PEM) (default: no TLS)")
    parser.add_argument("--tls-key", default=None, metavar="FILE", help="the key of --tls-cert (default: none)")
    parser.add_argument("--tls-ca", default=None, metavar="FILE",
                        help="the CA agents and workers check the certificate against; `run` hands it to the agents "
                             "it starts (default: --tls-cert itself, for a self-signed certificate)")
    parser.add_argument("--secret-file", default=None, metavar="FILE",
                        help="the job secret that every agent, worker and API change must prove (mode 600; made with "
                             f"a new secret if missing) (default: ${SECRET_ENV}; else `run` makes one for the job and "
                             "`serve` refuses to start)")
