"""The pool's commands: `ringmaster pool serve` (one pool of hosts for many jobs), `submit`,
`jobs` and `cancel` (talking to it through its control API).

`pool serve` takes its hosts as `run` does (-H, a discovery script; the same launchers) and
lends their slots to the jobs submitted to it under --policy. Its admin secret is
--secret-file / $RINGMASTER_SECRET, or one made for it and kept in a private file that the other
commands on this machine find by the pool's URL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import sys
import urllib.parse
from typing import Any, TextIO

from ringmaster import settings as defaults
from ringmaster.cli import remote
from ringmaster.cli.api_client import ApiClient, ApiError
from ringmaster.cli.job_files import find_job_secret, remove_job_secret, save_job_secret
from ringmaster.cli.remote import table
from ringmaster.common.errors import RingmasterError, UsageError
from ringmaster.common.secret import SECRET_ENV, generate_secret, read_private_file, read_secret_file, secret_from
from ringmaster.rendezvous.scheduling.sizing import POLICIES
from ringmaster.rendezvous.server.launch_plan import LAUNCHER_ENV, SSH_OPTIONS_ENV, SshOptions, choose_launcher
from ringmaster.rendezvous.server.launchers import LAUNCHERS

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
                       help="a job is not resized again within S seconds unless a host under it failed or a job of "
                            "higher precedence needs its slots (default: 60)")
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


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        if args.verb == "pool" and args.pool_verb == "agent":
            return pool_agent(args)
        if args.verb == "pool":
            return serve(args)
        client = ApiClient(args.pool, credential(args), args.tls_ca)
        if args.verb == "submit":
            return submit(client, args, out)
        if args.verb == "jobs":
            return list_jobs(client, out)
        if args.verb == "logs":
            return remote.events(client, 0, args.follow, args.json, out, job=args.job,
                                 ended=lambda: job_ended(client, args.job))
        answer = client.post(f"/jobs/{urllib.parse.quote(args.job, safe='')}/cancel", {})
        print(f"ringmaster: job {answer.get('id')} is {answer.get('state')}", file=out)
        return 0
    except RingmasterError as exc:
        print(f"ringmaster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def job_ended(client: ApiClient, job_id: str) -> int | None:
    """A pool job's exit status once it has ended (0: succeeded; 1: failed or cancelled), else None."""
    state = client.get(f"/jobs/{urllib.parse.quote(job_id, safe='')}").get("state")
    return None if state not in ("succeeded", "failed", "cancelled") else int(state != "succeeded")


def credential(args: argparse.Namespace) -> str | None:
    """What a client command sends: --token-file, $RINGMASTER_POOL_TOKEN, the secret, or the secret
    a pool made on this machine kept for its URL."""
    if args.token_file:
        return read_private_file(args.token_file, "--token-file").strip() or None
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    return secret_from(args.secret_file, os.environ) or find_job_secret(args.pool)


def submit(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("no training command given; e.g. ringmaster submit --pool URL --min-np 2 python train.py")
    min_np = args.min_np or args.np or args.group_size
    max_np = args.max_np or args.np or min_np
    answer = client.post("/jobs", {"command": command, "min_np": min_np, "max_np": max_np, "name": args.name,
                                   "queue": args.queue, "priority": args.priority,
                                   "gpus_per_worker": args.gpus_per_worker, "cpus_per_worker": args.cpus_per_worker,
                                   "group_size": args.group_size})
    print(answer["id"], file=out)
    return 0


def list_jobs(client: ApiClient, out: TextIO) -> int:
    rows: list[Any] = client.get("/jobs")
    if not isinstance(rows, list):
        raise ApiError(f"{client.api}/jobs answered something else than a list of jobs")
    print("\n".join(table(("id", "queue", "priority", "state", "size", "hosts", "steps/s", "reason"), [
        (j["id"], j["queue"], j["priority"], j["state"], f"{j['size']} ({j['min_np']}-{j['max_np']}{_groups(j)})",
         ",".join(f"{h}:{n}" for h, n in j["hosts"].items()) or "-",
         "-" if j.get("steps_per_second") is None else f"{j['steps_per_second']:.2f}", j["reason"]) for j in rows])),
          file=out)
    return 0


def _groups(row: dict[str, Any]) -> str:
    """`jobs`' note of a job's replica groups, after its --min-np and --max-np."""
    group_size = row.get("group_size", 1)
    return f" in groups of {group_size}" if isinstance(group_size, int) and group_size > 1 else ""


def parse_queue_weights(text: str) -> dict[str, float]:
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not name or not 0 < weight <= 1e6 or len(name) > 200:
            raise UsageError(f"--queue-weights {text[:200]!r}: {part[:80]!r} is not QUEUE=WEIGHT with a weight from 0 "
                             "to 1e6")
        weights[name.strip()] = weight
    return weights


def pool_agent(args: argparse.Namespace) -> int:
    import socket

    from ringmaster.cli.pool_agent import run_pool_agent
    from ringmaster.common import logs
    from ringmaster.common.events import emitter
    from ringmaster.common.handover import MAX_HANDOVER_BYTES, read_handover
    from ringmaster.common.keys import parse_key, pool_host_key
    from ringmaster.common.processes import die_with_parent
    from ringmaster.discovery.parse import MAX_SLOTS_PER_HOST, host_name_problem
    from ringmaster.worker.agent.slots import default_slots, visible_gpus

    host = args.host or socket.gethostname()
    problem = host_name_problem(host)
    if problem:
        raise UsageError(f"--host {host[:80]!r}: {problem}")
    slots = args.slots if args.slots is not None else default_slots(os.environ)
    if not 1 <= slots <= MAX_SLOTS_PER_HOST:
        raise UsageError(f"--slots {slots}: a host has 1 to {MAX_SLOTS_PER_HOST}")
    gpus = args.gpus if args.gpus is not None else float(visible_gpus(os.environ))
    cpus = args.cpus if args.cpus is not None else float(os.cpu_count() or 1)
    if not (0 <= gpus <= 1e6 and 0 <= cpus <= 1e6):
        raise UsageError(f"--gpus {gpus:g} --cpus {cpus:g}: each from 0 to 1e6")
    if args.from_launcher:  # started by the pool for one of its hosts: its key on stdin, which stays open
        try:
            handed, environment = read_handover(sys.stdin.buffer.readline(MAX_HANDOVER_BYTES + 1))
            key = parse_key(handed, "the pool's handover").hex()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        os.environ.update(environment)
        logs.configure(args.log_format, args.log_level)  # (as the launching environment asks: it came just now)
        if args.die_with_parent:
            die_with_parent(os.getppid())
        return run_pool_agent(args.pool, host, slots, {"gpu": gpus, "cpu": cpus}, key, args.tls_ca,
                              emitter(logs.POOL_AGENT), stop_when_stdin_closes=True, warm_ahead=args.warm_ahead)
    join_secret = secret_from(args.secret_file, os.environ)
    if join_secret is None:
        raise UsageError("the pool's join secret is needed: --secret-file FILE (the file `pool serve "
                         f"--join-secret-file` names, copied here), or ${SECRET_ENV}")
    key = pool_host_key(join_secret, host).hex()
    del join_secret  # the host's key is all it keeps
    return run_pool_agent(args.pool, host, slots, {"gpu": gpus, "cpu": cpus}, key, args.tls_ca,
                          emitter(logs.POOL_AGENT),
                          warm_ahead=args.warm_ahead)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ringmaster.common import logs
    from ringmaster.common.events import Kind, emitter
    from ringmaster.common.tls import TLS_CA_ENV, ServerTls, read_pem
    from ringmaster.discovery import HostDiscovery, ScriptDiscovery, StaticDiscovery, parse_hosts_flag
    from ringmaster.rendezvous.pool.api import create_pool_app
    from ringmaster.rendezvous.pool.host_board import HostBoard
    from ringmaster.rendezvous.pool.service import PoolService
    from ringmaster.rendezvous.pool.tokens import parse_queue_tokens
    from ringmaster.rendezvous.scheduling.model import Settings as Rules
    from ringmaster.rendezvous.state.leadership import Leadership
    from ringmaster.rendezvous.state.open_store import open_store
    from ringmaster.rendezvous.state.url import STORE_PASSWORD_ENV, parse_store

    say = emitter(logs.RENDEZVOUS)
    if args.min_resize_interval < 0 or args.blacklist_cooldown < 0 or not 0 <= args.resize_cost <= 3600:
        raise UsageError("--min-resize-interval, --blacklist-cooldown and --resize-cost are seconds, 0 or more "
                         "(--resize-cost at most an hour)")
    rules = Rules(min_resize_interval_s=args.min_resize_interval, queue_weights=parse_queue_weights(args.queue_weights),
                  resize_cost_s=args.resize_cost)
    board = join_secret = None
    if not 0 < args.host_timeout <= 3600:
        raise UsageError(f"--host-timeout {args.host_timeout:g}: seconds, more than 0 and at most an hour")
    if args.hosts_from_agents:
        if not args.join_secret_file:
            raise UsageError("--hosts-from-agents needs --join-secret-file FILE: the secret hosts' pool agents derive "
                             "their keys from (made when missing; copy it to the hosts)")
        board = HostBoard(args.host_timeout)
        join_secret = read_secret_file(args.join_secret_file, create=True)
    source: HostDiscovery = board if board is not None else (
        ScriptDiscovery(args.host_discovery_script, args.slots_per_host, defaults.DEFAULT_DISCOVERY_TIMEOUT_S)
        if args.host_discovery_script else StaticDiscovery(parse_hosts_flag(args.hosts, args.slots_per_host or 1)))
    source.find_hosts()  # a bad host list or script refuses to start here
    tokens = parse_queue_tokens(read_private_file(args.queue_tokens, "--queue-tokens", 1 << 20),
                                {"default", *rules.queue_weights}) \
        if args.queue_tokens else {}
    secret = secret_from(args.secret_file, os.environ, create=True)
    made = secret is None
    secret = secret or generate_secret()
    if not 0 < args.checkpoint_interval <= 86_400:
        raise UsageError(f"--checkpoint-interval {args.checkpoint_interval:g}: seconds, more than 0 and at most a day")
    job_settings = {"spares": args.spares, "warmup_grace_s": args.warmup_grace, "start_timeout_s": args.start_timeout,
                    "drain_grace_s": args.drain_grace, "discovery_interval_s": 0.2,
                    "stragglers": args.stragglers, "straggler_slowdown": args.straggler_slowdown,
                    "checkpoint_interval_s": args.checkpoint_interval}
    launcher = choose_launcher(args.launcher, os.environ)
    server_tls = ServerTls.from_files(args.tls_cert, args.tls_key)
    if server_tls is not None:  # the pool agents it starts, here or over ssh, get the CA in their environment
        os.environ[TLS_CA_ENV] = read_pem(args.tls_ca, "--tls-ca").decode() if args.tls_ca else server_tls.cert.decode()
    spec = parse_store(args.store, password=os.environ.get(STORE_PASSWORD_ENV) or None)
    saved: list[pathlib.Path] = []
    outcome: list[str] = []

    async def run() -> None:
        store = await open_store(spec)
        leadership = None
        if spec.kind != "memory":
            leadership = Leadership(store, spec.prefix + "pool/",
                                    f"{args.advertise_address or args.bind}:{args.api_port}")
            await leadership.acquire(wait=True)  # a standby pool waits here while another leads
        pool = PoolService(source, args.policy, rules, job_settings, pathlib.Path(args.checkpoint_root).resolve(), say,
                           launcher=launcher, ssh=SshOptions.from_text(args.ssh_port, args.ssh_identity_file,
                                                                       os.environ.get(SSH_OPTIONS_ENV,
                                                                                      "")), bind=args.bind,
                           advertise=args.advertise_address,
                           discovery_interval_s=args.discovery_interval, blacklist_cooldown_s=args.blacklist_cooldown,
                           store=store if leadership is not None else None, leadership=leadership, prefix=spec.prefix,
                           board=board, join_secret=join_secret, tls=server_tls,
                           host_timeout_s=args.host_timeout)
        hosts = await asyncio.to_thread(source.find_hosts)
        await pool.take_up(hosts)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, pool.stop)
        config = uvicorn.Config(create_pool_app(pool, secret, tokens), host=args.bind, port=args.api_port,
                                log_level="warning",
                                lifespan="off", ssl_certfile=server_tls.cert_file if server_tls else None,
                                ssl_keyfile=server_tls.key_file if server_tls else None)
        api = uvicorn.Server(config)
        api.capture_signals = lambda: __import__("contextlib").nullcontext()  # type: ignore[method-assign]
        serving = asyncio.create_task(api.serve())
        while not api.started:
            if serving.done():
                serving.result()
                raise UsageError(f"the pool's control API could not listen on {args.bind}:{args.api_port}")
            await asyncio.sleep(0.02)
        port = api.servers[0].sockets[0].getsockname()[1]
        url = f"{'https' if server_tls else 'http'}://{args.advertise_address or args.bind}:{port}"
        pool.pool_hosts.url = url  # (the pool agents it starts on named hosts dial it)
        if made:
            saved.append(save_job_secret(url, secret))
        say(Kind.POOL_LISTENING, url=url, policy=args.policy, slots=sum(hosts.values()),
            hosts=",".join(f"{h}:{n}" for h, n in hosts.items()) or
            ("hosts that join with `ringmaster pool agent`" if board is not None else "(none yet)"))
        if leadership is not None:
            await leadership.announce(url)
        try:
            await pool.run()
        finally:
            api.should_exit = True
            await serving
            if leadership is not None and pool.deposed is None:
                await leadership.resign()
            await store.close()
        if pool.deposed is not None:
            say(Kind.POOL_DEPOSED, reason=pool.deposed)
            outcome.append(pool.deposed)

    try:
        asyncio.run(run())
    finally:
        for path in saved:
            remove_job_secret(path)
    return 1 if outcome else 0
