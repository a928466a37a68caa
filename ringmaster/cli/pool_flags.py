"""The flags of the pool's commands: `ringmaster pool serve`, `pool agent`, and the commands that
talk to a pool's control API (`submit`, `jobs`, `cancel`, `logs`)."""

from __future__ import annotations

import argparse
import os

from ringmaster import settings as defaults
from ringmaster.common.secret import SECRET_ENV
from ringmaster.launch.launch_plan import LAUNCHER_ENV
from ringmaster.launch.launchers import LAUNCHERS
from ringmaster.rendezvous.scheduling.sizing import POLICIES

#: Where `pool serve` keeps jobs' checkpoints (suspended jobs resume from them) unless told.
DEFAULT_CHECKPOINT_ROOT = "ringmaster-pool/checkpoints"
POOL_ENV = "RINGMASTER_POOL"
TOKEN_ENV = "RINGMASTER_POOL_TOKEN"


def add_verbs(sub: argparse._SubParsersAction) -> None:
    pool = sub.add_parser("pool", help="run a pool of hosts shared by many elastic jobs (`pool serve`)",
                          description="A pool of hosts lent to many elastic jobs under a scheduling policy.")
    verbs = pool.add_subparsers(dest="pool_verb", required=True)
    serve = verbs.add_parser("serve", help="serve the pool: hosts from -H or a discovery script, jobs from `submit`",
                             description="Serve a pool of hosts: jobs submitted to it (`ringmaster submit`) start when "
                                         "their --min-np slots are free together, and are grown, shrunk (at their "
                                         "commits) or suspended (at a durable checkpoint) as --policy says.")
    _serve_hosts_and_jobs_flags(serve)
    _serve_service_flags(serve)
    _agent_verb(verbs)
    _job_client_verbs(sub)


def _serve_hosts_and_jobs_flags(serve: argparse.ArgumentParser) -> None:
    """`pool serve`: where its hosts come from, and how it shares them between jobs."""
    hosts = serve.add_mutually_exclusive_group(required=True)
    hosts.add_argument("-H", "--hosts", default=None, help="host1:slots,host2:slots (as `run -H`)")
    hosts.add_argument("--host-discovery-script", default=None,
                       metavar="PATH", help="prints host:slots lines (as `run`)")
    hosts.add_argument("--hosts-from-agents", action="store_true",
                       help="hosts join by connecting: `ringmaster pool agent --pool URL` on each, proving a key "
                            "derived from --join-secret-file; one such process per host serves every job placed there")
    serve.add_argument("--join-secret-file", default=None, metavar="FILE",
                       help="with --hosts-from-agents: the secret hosts' pool agents derive their keys from (made, "
                            "mode 600, when missing); copy it to the hosts")
    serve.add_argument("--host-timeout", type=float, default=15.0, metavar="S",
                       help="a host whose pool agent has not polled for S seconds leaves the pool (time the pool "
                            "itself did not run is not counted; default: 15)")
    serve.add_argument("--slots-per-host", type=int, default=None, metavar="N", help="slots of hosts that name none")
    serve.add_argument("--discovery-interval", type=float, default=1.0,
                       metavar="S", help="seconds between two host polls (default: 1)")
    serve.add_argument("--policy", choices=POLICIES, default="fifo",
                       help="fifo: first come first served, with backfill; priority: higher --priority shrinks lower "
                            "jobs toward their --min-np, then suspends the lowest; fair: weighted max-min fair shares "
                            "of slots between queues; las: least attained service first (Tiresias); goodput: each "
                            "slot to the job whose measured scaling gains most from it (default: fifo)")
    serve.add_argument("--resize-cost", type=float, default=5.0, metavar="S",
                       help="with --policy goodput: seconds a resize is taken to pause a job, weighed against its gain "
                            "over --min-resize-interval (default: 5)")
    serve.add_argument("--queue-weights", default="", metavar="Q=W,...",
                       help="the pool's queues and their weights, e.g. team-a=2,team-b=1 (the queue `default` always "
                            "exists)")
    serve.add_argument("--min-resize-interval", type=float, default=60.0, metavar="S",
                       help="a job is not resized again within S seconds of first training at its new size unless a "
                            "host under it failed or a job of higher precedence needs its slots (default: 60)")
    serve.add_argument("--blacklist-cooldown", type=float, default=300.0, metavar="S",
                       help="seconds a host that failed under a job stays out of the pool (default: 300)")
    serve.add_argument("--checkpoint-root", default=DEFAULT_CHECKPOINT_ROOT, metavar="DIR",
                       help="each job's checkpoints go to DIR/JOB_ID; a suspended job resumes from them "
                            f"(default: ./{DEFAULT_CHECKPOINT_ROOT})")
    serve.add_argument("--store", default="memory", metavar="URL",
                       help="where the pool keeps its jobs: memory (gone with this process), or etcd://HOST:PORT[,...]"
                            "[/PREFIX]: a pool started again, or a standby `pool serve` on the same store (it waits "
                            "while another leads), takes every job up (running ones from their last checkpoint)")
    serve.add_argument("--checkpoint-interval", type=float, default=300.0, metavar="S",
                       help="each job writes a durable checkpoint at least every S seconds (what a pool started "
                            "again resumes from) (default: 300)")


def _serve_service_flags(serve: argparse.ArgumentParser) -> None:
    """`pool serve`: how it starts its hosts' agents, where it listens, its secrets, its jobs' settings."""
    serve.add_argument("--launcher", choices=[n for n in LAUNCHERS if n != "none"], default=None,
                       help="how jobs' agents are started on the hosts, as `run --launcher` (default: "
                            f"${LAUNCHER_ENV}, else ssh)")
    serve.add_argument("--ssh-port", type=int, default=None, metavar="P", help="ssh port of the hosts (default: ssh's)")
    serve.add_argument("--ssh-identity-file", default=None, metavar="FILE", help="ssh private key (default: ssh's)")
    serve.add_argument("--bind", default="127.0.0.1", metavar="ADDR", help="address the pool and its jobs listen on")
    serve.add_argument("--advertise-address", default=None, metavar="HOST", help="what hosts dial (default: --bind)")
    serve.add_argument("--api-port", type=int, default=0, metavar="P",
                       help="port of the pool's control API (default: a free one)")
    serve.add_argument("--secret-file", default=None, metavar="FILE",
                       help=f"the pool's admin secret (default: ${SECRET_ENV}, else one made and kept for this "
                            "machine's `submit`, `jobs`, `cancel`)")
    serve.add_argument("--queue-tokens", default=None, metavar="FILE",
                       help="per-queue tokens (mode 600; a line `QUEUE TOKEN` each): a token's holder submits, lists, "
                            "scales and cancels the jobs of its queue only")
    serve.add_argument("--tls-cert", default=None, metavar="FILE",
                       help="serve the pool's API and every job's rendezvous over TLS with this certificate (for the "
                            "address hosts dial); hosts' pool agents need it to join from another machine")
    serve.add_argument("--tls-key", default=None, metavar="FILE", help="the key of --tls-cert (mode 600)")
    serve.add_argument("--tls-ca", default=None, metavar="FILE",
                       help="the CA --tls-cert chains to, handed to the pool agents it starts (default: the "
                            "certificate)")
    serve.add_argument("--spares", type=int, default=0, metavar="N", help="warm spares per job agent (default: 0)")
    serve.add_argument("--warmup-grace", type=float, default=defaults.DEFAULT_WARMUP_GRACE_S, metavar="S",
                       help="seconds a running job waits for newcomers to warm up before a resize (as `run`)")
    serve.add_argument("--start-timeout", type=float, default=defaults.DEFAULT_START_TIMEOUT_S, metavar="S",
                       help="seconds for a job's workers to start (as `run`), and that the pool, as it starts, waits "
                            "for every host it names to join before it places a job")
    serve.add_argument("--stragglers", choices=("report", "replace"), default="report",
                       help="a host whose ranks are slower than a job's other hosts' (its step time besides waiting "
                            "for the ring, --straggler-slowdown times or more): report it, or replace it: it leaves "
                            "the pool for --blacklist-cooldown and the job takes another host at a commit (default: "
                            "report)")
    serve.add_argument("--straggler-slowdown", type=float, default=1.2, metavar="X",
                       help="how much slower a straggler's ranks are than the other hosts' (default: 1.2)")
    serve.add_argument("--drain-grace", type=float, default=defaults.DEFAULT_DRAIN_GRACE_S, metavar="S",
                       help="seconds a job being suspended has to reach a commit (as `run`)")
    for parser in (serve,):
        parser.add_argument("--log-format", choices=["text", "json"], default=None)
        parser.add_argument("--log-level", default=None)


def _agent_verb(verbs: argparse._SubParsersAction) -> None:
    """`pool agent`: this host joins a pool."""
    agent = verbs.add_parser("agent", help="join this host to a pool (`pool serve --hosts-from-agents`)",
                             description="Join this host to a pool and serve every job the pool places on it: for "
                                         "each, start that job's agent (which starts its workers), and stop it when "
                                         "the pool takes the job off. SIGTERM or SIGINT: the jobs' workers leave this "
                                         "host at their next commit, then it leaves the pool.")
    agent.add_argument("--pool", default=os.environ.get(POOL_ENV), required=POOL_ENV not in os.environ,
                       help=f"the pool's control API, as `pool serve` printed it (default: ${POOL_ENV})")
    agent.add_argument("--host", default=None, metavar="NAME", help="this host's name in the pool (default: its "
                                                                    "hostname)")
    agent.add_argument("--slots", type=int, default=None, metavar="N",
                       help="workers this host runs at once (default: the GPUs it sees, else 1)")
    agent.add_argument("--gpus", type=float, default=None, metavar="N",
                       help="GPUs this host lends to jobs that ask for them (default: the GPUs it sees)")
    agent.add_argument("--cpus", type=float, default=None, metavar="N",
                       help="CPUs this host lends to jobs that ask for them (default: its CPU count)")
    agent.add_argument("--secret-file", default=None, metavar="FILE",
                       help=f"the pool's join secret (`pool serve --join-secret-file`) (default: ${SECRET_ENV})")
    agent.add_argument("--tls-ca", default=None, metavar="FILE", help="the CA of an https:// pool API")
    agent.add_argument("--warm-ahead", action=argparse.BooleanOptionalAction, default=True,
                       help="keep one job agent started ahead of the next job, its spare per slot importing torch, "
                            "so a job placed here starts its workers warm (default: on)")
    agent.add_argument("--from-launcher", action="store_true", help=argparse.SUPPRESS)  # the pool started it
    agent.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)
    agent.add_argument("--log-format", choices=["text", "json"], default=None)
    agent.add_argument("--log-level", default=None)


def _job_client_verbs(sub: argparse._SubParsersAction) -> None:
    """`submit`, `jobs`, `cancel`, `logs`: a pool's jobs through its control API."""
    submit = sub.add_parser("submit", help="submit a job to a pool (prints its id)",
                            description="Submit an elastic job to a pool: it starts when --min-np slots are free "
                                        "together, and grows toward --max-np with what is left over.")
    _client_flags(submit)
    submit.add_argument("--name", default=None, help="a name (the job's id starts with it)")
    submit.add_argument("--queue", default="default", help="the queue (default: default)")
    submit.add_argument("--priority", type=int, default=0, help="higher runs first under --policy priority (default: "
                                                                "0)")
    submit.add_argument("-np", "--num-proc", dest="np", type=int, default=None, help="workers (min and max alike)")
    submit.add_argument("--min-np", type=int, default=None, help="fewest workers (default: -np, else 1)")
    submit.add_argument("--max-np", type=int, default=None, help="most workers (default: --min-np)")
    submit.add_argument("--gpus-per-worker", type=float, default=0, metavar="N",
                        help="GPUs each worker takes (hosts that join with `pool agent` declare theirs; with --policy "
                             "fair, queues get equal dominant shares of slots, GPUs and CPUs)")
    submit.add_argument("--cpus-per-worker", type=float, default=0, metavar="N", help="CPUs each worker takes")
    submit.add_argument("--group-size", type=int, default=1, metavar="K",
                        help="workers per replica group (FSDP2 inside a group, hvd.elastic.mesh()): the pool sizes the "
                             "job in whole groups, so -np, --min-np and --max-np must be multiples of K (default: 1)")
    submit.add_argument("command", nargs=argparse.REMAINDER, help="the training command, e.g. python train.py")
    jobs = sub.add_parser(
        "jobs",
        help="list a pool's jobs",
        description="List a pool's jobs: id, queue, priority, state, size, hosts, steps/s and why it is so.",
    )
    _client_flags(jobs)
    cancel = sub.add_parser("cancel", help="cancel a job of a pool", description="Cancel a pool's job: a running one's "
                                                                                 "workers are stopped.")
    _client_flags(cancel)
    cancel.add_argument("job", metavar="ID")
    logs_verb = sub.add_parser("logs", help="print a pool job's events (--follow: until it ends)",
                               description="Print the events of a pool's job (its rendezvous', agents' and workers' "
                                           "doings, as `ringmaster events`); with --follow, until it ends.")
    _client_flags(logs_verb)
    logs_verb.add_argument("job", metavar="ID")
    logs_verb.add_argument("--follow", "-f", action="store_true", help="keep printing new events until the job ends")
    logs_verb.add_argument("--json", action="store_true", help="one JSON object per event")


def _client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", default=os.environ.get(POOL_ENV), required=POOL_ENV not in os.environ,
                        help=f"the pool's control API, as `pool serve` printed it (default: ${POOL_ENV})")
    parser.add_argument("--secret-file", default=None, metavar="FILE",
                        help=f"the pool's secret (default: ${SECRET_ENV})")
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help=f"instead of the secret, a queue's token (mode 600) (default: ${TOKEN_ENV})")
    parser.add_argument("--tls-ca", default=None, metavar="FILE", help="the CA of an https:// pool API")


