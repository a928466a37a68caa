"""The `ringmaster` command: `run` (an elastic job), `serve` (the rendezvous alone), `agent`.

Flags follow horovodrun's elastic flags with Horovod's meaning; every default is shown by
`ringmaster run --help` and listed in README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import logging
import os
import pathlib
import signal
import sys
import textwrap
import time
from typing import Any, Mapping

from pydantic import ValidationError

from ringmaster import __version__
from ringmaster import settings as defaults
from ringmaster.cli import pool as pool_verbs
from ringmaster.cli import pool_flags, remote
from ringmaster.cli.job_files import find_job_secret, remove_job_secret, save_job_secret
from ringmaster.cli.job_flags import add_job_flags
from ringmaster.cli.progress import ProgressLine
from ringmaster.common import logs
from ringmaster.common.api_client import ApiClient
from ringmaster.common.errors import RingmasterError, UsageError
from ringmaster.common.events import Event, Kind, log_event
from ringmaster.common.keys import agent_key
from ringmaster.common.network import NetworkError, interface_address, route_address
from ringmaster.common.processes import skip_teardown_at_exit
from ringmaster.common.secret import SECRET_ENV, SecretError, generate_secret, read_private_file, secret_from
from ringmaster.common.tls import TLS_CA_ENV, ServerTls, read_pem
from ringmaster.discovery import HostDiscovery, ScriptDiscovery, StaticDiscovery, host_name_problem, parse_hosts_flag
from ringmaster.discovery.errors import DiscoveryError
from ringmaster.discovery.parse import MAX_HOSTFILE_BYTES, parse_hostfile
from ringmaster.discovery.slurm import SlurmDiscovery
from ringmaster.launch.launch_plan import (
    DEFAULT_LAUNCHER,
    LAUNCHER_ENV,
    SSH_OPTIONS_ENV,
    SshOptions,
    choose_launcher,
)
from ringmaster.launch.launchers import LAUNCHERS
from ringmaster.proto import environment as env_names
from ringmaster.rendezvous.control.records import JobOutcome, Summary
from ringmaster.rendezvous.state.url import STORE_PASSWORD_ENV, parse_store
from ringmaster.settings import JobSettings
from ringmaster.worker.agent.flags import add_drain_flags
from ringmaster.worker.agent.starting.heap import heap_choice_error

log = logging.getLogger(logs.CLI)


#: What each verb's --help shows below its flags.
_EXAMPLES = {
    "run": "examples:\n  ringmaster run -np 2 python train.py                       # two workers on this machine\n"
           "  ringmaster run -np 8 -H node1:4,node2:4 python train.py     # over ssh, as horovodrun\n"
           "  ringmaster run --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh python train.py",
    "serve": "example:\n  ringmaster serve --secret-file job.secret --bind 0.0.0.0 --port 29400 -H node1:4,node2:4 "
             "python train.py\n  (then on each host: ringmaster agent --secret-file job.secret --rendezvous HOST:29400 "
             "--host node1)",
    "scale": "example:\n  ringmaster scale --api http://127.0.0.1:PORT -np 4   # the URL `run` printed",
    "drain": "example:\n  ringmaster drain --api http://127.0.0.1:PORT hostB --deadline 120   # before maintenance",
    "undrain": "example:\n  ringmaster undrain --api http://127.0.0.1:PORT hostB",
    "status": "example:\n  ringmaster status --api http://127.0.0.1:PORT",
    "events": "example:\n  ringmaster events --api http://127.0.0.1:PORT --follow",
    "demo": "examples:\n  ringmaster demo            # about a minute; then open ringmaster-demo/demo.png\n"
            "  ringmaster demo --quick    # a few seconds of training",
    "plot": "examples:\n  ringmaster plot ringmaster-demo -o demo.png\n  ringmaster run --log-format json -np 2 "
            "python train.py > job.jsonl; ringmaster plot job.jsonl -o job.png",
}


def _verb(sub: argparse._SubParsersAction, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=summary, description=textwrap.fill(description, 90), epilog=_EXAMPLES.get(name),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringmaster", description="Elastic training for PyTorch.")
    parser.add_argument("--version", action="version", version=f"ringmaster {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True)
    run = _verb(sub, "run", "run an elastic job: starts the rendezvous and every host's agent (over ssh)",
                "Run an elastic training job: the rendezvous here and an agent on each host (over ssh; hosts that "
                "are this machine run here). With no hosts given, -np N workers run on this machine.")
    add_job_flags(run)
    _add_launch_flags(run)
    add_job_flags(_verb(sub, "serve", "run the rendezvous alone; start `ringmaster agent` on each host",
                         "Run the rendezvous of a job alone: agents started by something else (ssh, Kubernetes, "
                         "Slurm) connect to it with the job's secret."))
    scale = _verb(sub, "scale", "ask a running job for a number of workers (within --min-np and --max-np)",
                  "Ask a running job for a number of workers; it shrinks or grows at its next commit.")
    remote.add_api_flags(scale)
    scale.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of workers wanted")
    drain = _verb(sub, "drain", "take a host out of a running job at its workers' next commit (no work lost)",
                  "Take a host out of a running job politely: its workers leave at their next commit and the others "
                  "go on without a rollback; the host is not blacklisted and stays out until `ringmaster undrain`. "
                  "Workers still there when the deadline passes are stopped, and the others recover from their "
                  "last commit.")
    remote.add_api_flags(drain)
    drain.add_argument("host", help="the host's name, as `ringmaster status` lists it")
    drain.add_argument("--deadline", type=float, default=None, metavar="S",
                       help="seconds for its workers to reach a commit (default: "
                            f"{defaults.DEFAULT_DRAIN_DEADLINE_S:g})")
    undrain = _verb(sub, "undrain", "let a drained host back into a running job",
                    "Let a drained host back into a running job: workers start there and join at the next commit.")
    remote.add_api_flags(undrain)
    undrain.add_argument("host", help="the host's name")
    remote.add_api_flags(_verb(sub, "status", "print a running job's state, hosts and workers",
                               "Print a running job's state, hosts and workers."))
    events = _verb(sub, "events", "print a running job's events (--follow: until it ends)",
                   "Print a running job's events, by number; with --follow, until the job ends.")
    remote.add_api_flags(events)
    events.add_argument("--since", type=int, default=0, metavar="N",
                        help="from the event numbered N (default: the first kept)")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events until the job ends")
    events.add_argument("--json", action="store_true", help="one JSON object per event (seq, kind, level, generation, "
                                                            "time, message, fields)")
    demo = _verb(sub, "demo", "watch an elastic job survive a dead host, a host coming back and scaling (on this "
                              "machine)",
                 "Train a small network on handwritten digits on two emulated hosts of this machine; kill one "
                 "outright, bring it back, scale down and up, and say what happens each time. Ends with the test "
                 "accuracy beside a fault-free run's, what each fault cost, and a picture (demo.png).")
    demo.add_argument("--quick", action="store_true", help="a few seconds of training (as CI runs it)")
    demo.add_argument("--hold", type=float, default=None, metavar="S",
                      help="seconds the job stays up after training, to open its dashboard (default: 5; --quick: 0)")
    demo.add_argument("--out", default="ringmaster-demo", metavar="DIR",
                      help="folder for the log, picture and timeline (default: ./ringmaster-demo)")
    demo.add_argument("--seed", type=int, default=0, help="the training's seed (default: 0)")
    plot = _verb(sub, "plot", "draw a job's loss, accuracy, world size and faults from its JSON log (PNG)",
                 "Draw a picture of a job from its JSON log (`ringmaster run --log-format json` or `ringmaster "
                 "events --json` output, or a `ringmaster demo` folder): training loss and test accuracy against the "
                 "step (from lines the script prints as JSON with step, loss, accuracy), the world size against "
                 "time with each generation shaded by its cause, and each fault marked with its recovery time.")
    plot.add_argument("log", metavar="EVENTS|RUN_DIR", help="the job's JSON log, or a folder holding events.jsonl")
    plot.add_argument("-o", "--output", required=True, metavar="FILE.png", help="where to write the picture")
    plot.add_argument("--against", metavar="EVENTS|RUN_DIR", default=None,
                      help="another job's log (a fault-free run of the same seed): its loss drawn under this one's, "
                           "and the largest difference at a step both trained")
    agent = sub.add_parser("agent", help="run the per-host agent that starts and stops workers")
    agent.add_argument("agent_args", nargs=argparse.REMAINDER, help="see python -m ringmaster.worker.agent --help")
    pool_flags.add_verbs(sub)
    key = sub.add_parser("agent-key", help="print the key of one host's agent, derived from the job secret (for "
                                           "`ringmaster agent --agent-key-file`: that agent can then act for its host "
                                           "only)")
    key.add_argument("host", metavar="HOST", help="the host's name, as discovery lists it and its agent's --host says")
    key.add_argument("--secret-file", default=None, metavar="FILE", help=f"the job secret (default: ${SECRET_ENV})")
    return parser


def _command_of(args: argparse.Namespace) -> list[str]:
    """The training command (`python` is the interpreter Ringmaster runs in, as torchrun does)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no training command given; e.g. ringmaster run -np 2 python train.py")
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    return command


def _check_flags(args: argparse.Namespace) -> None:
    """What argparse cannot check of the flags alone (UsageError names the flag)."""
    for flag, address in (("--bind", getattr(args, "bind", None)),
                          ("--advertise-address", getattr(args, "advertise_address", None))):
        if address and ":" in address:
            raise UsageError(f"{flag} {address}: IPv6 addresses are not supported; give an IPv4 address "
                             "(0.0.0.0 listens on every interface) or a host name")
    if sum(bool(x) for x in (args.hosts, args.hostfile, args.host_discovery_script)) > 1:
        raise UsageError("give one of -H/--hosts, --hostfile and --host-discovery-script")
    if args.hostfile:
        args.hosts = hosts_flag_of(read_hostfile(args.hostfile, args.slots_per_host or 1))
    interface = getattr(args, "network_interface", None)
    if interface and "," in interface:
        raise UsageError(f"--network-interface {interface}: give one interface name, which every host has "
                         "(several names, as horovodrun takes them, are not supported)")
    if args.fusion_threshold_mb is not None and not 0 <= args.fusion_threshold_mb <= 1 << 20:
        raise UsageError(f"--fusion-threshold-mb {args.fusion_threshold_mb:g}: give 0 (no fusion) to 1048576 megabytes")
    for flag, value in (("-np", args.np), ("--min-np", args.min_np), ("--max-np", args.max_np),
                        ("--group-size", args.group_size)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    if args.np is not None and args.np % args.group_size:
        raise UsageError(f"-np {args.np} is not a whole number of groups of --group-size {args.group_size}: give a "
                         f"multiple of {args.group_size}")
    if args.slots_per_host is not None and args.slots_per_host <= 0:
        raise UsageError(f"--slots-per-host must be a positive integer, got {args.slots_per_host}")


def _discovery_of(args: argparse.Namespace) -> HostDiscovery:
    """Where the job's hosts come from: a script, fixed hosts, Slurm, joining agents, or this machine."""
    if args.host_discovery_script:
        return ScriptDiscovery(args.host_discovery_script, args.slots_per_host, args.discovery_timeout)
    if args.hosts:
        return StaticDiscovery(parse_hosts_flag(args.hosts, args.slots_per_host or 1))
    if getattr(args, "launcher", None) == "slurm":
        return SlurmDiscovery(os.environ, args.slots_per_host, args.discovery_timeout)
    if args.hosts_from_agents:
        return StaticDiscovery({})  # every host joins by connecting
    if args.np is None and args.max_np is None and args.min_np is None:
        raise UsageError("say how many workers: -np N (runs N workers on this machine)")
    return StaticDiscovery({"localhost": args.np or args.max_np or args.min_np})


def settings_from_args(args: argparse.Namespace) -> tuple[JobSettings, HostDiscovery, dict[str, int]]:
    """Turn flags into settings, a discovery source and the initial host set."""
    command = _command_of(args)
    _check_flags(args)
    discovery = _discovery_of(args)
    initial = discovery.find_hosts()  # a bad script refuses to start here
    min_np = args.min_np or args.np or args.group_size
    max_np = args.max_np
    elastic_hosts = bool(args.hosts) and args.min_np is not None  # horovodrun: -H with --min-np is elastic
    if max_np is None and not args.host_discovery_script and not elastic_hosts and args.np is not None:
        max_np = args.np
    # Elastic from the launch, as horovodrun decides it (and torchrun from --nnodes MIN:MAX): a
    # worker's failure before any worker entered hvd.elastic.run does not restart every worker.
    elastic = (bool(args.host_discovery_script) or elastic_hosts or bool(args.hosts_from_agents)
               or (max_np is not None and min_np < max_np))
    try:
        settings = JobSettings(
            command=command, min_np=min_np, max_np=max_np, group_size=args.group_size,
            elastic_timeout_s=args.elastic_timeout, reset_limit=args.reset_limit, max_restarts=args.max_restarts,
            discovery_interval_s=args.discovery_interval,
            discovery_timeout_s=args.discovery_timeout, heartbeat_interval_s=args.heartbeat_interval,
            heartbeat_timeout_s=args.heartbeat_timeout, heartbeat_relay=args.heartbeat_relay,
            collective_timeout_s=args.collective_timeout, busy_timeout_s=args.busy_timeout, elastic=elastic,
            reconnect_timeout_s=args.reconnect_timeout,
            start_timeout_s=args.start_timeout, stop_grace_s=args.stop_grace,
            spares=(args.spares if args.spares is not None
                    else os.environ.get(defaults.SPARES_ENV) or defaults.DEFAULT_SPARES),
            drain_grace_s=getattr(args, "drain_grace", defaults.DEFAULT_DRAIN_GRACE_S),
            notice_script=(os.path.abspath(args.preemption_notice_script)
                           if getattr(args, "preemption_notice_script", None) else None),
            notice_interval_s=getattr(args, "notice_interval", defaults.DEFAULT_NOTICE_INTERVAL_S),
            blacklist_cooldown_s=tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None,
            hosts_from_agents=args.hosts_from_agents, warmup_grace_s=args.warmup_grace,
            crash_loop_window_s=args.crash_loop_window, crash_loop_limit=args.crash_loop_limit,
            exit_report_timeout_s=args.exit_report_timeout, spare_last_hosts=args.spare_last_hosts,
            checkpoint_dir=os.path.abspath(args.checkpoint_dir) if args.checkpoint_dir else None,
            checkpoint_every=args.checkpoint_every, checkpoint_interval_s=args.checkpoint_interval,
            checkpoint_keep=args.checkpoint_keep,
            checkpoint_trusted=args.checkpoint_trusted,
            timeline=timeline_path(args.timeline, os.environ), timeline_max_mb=args.timeline_max_mb,
            fusion_threshold_bytes=(None if args.fusion_threshold_mb is None
                                    else int(args.fusion_threshold_mb * (1 << 20))),
            stragglers=args.stragglers, straggler_slowdown=args.straggler_slowdown,
            straggler_steps=args.straggler_steps,
        )
    except ValidationError as exc:
        raise UsageError("; ".join(_flag_error(e) for e in exc.errors())) from None
    return settings, discovery, initial


def read_hostfile(path: str, default_slots: int) -> dict[str, int]:
    """The hosts of horovodrun's --hostfile (bounded: the file is input)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_HOSTFILE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--hostfile {path}: cannot read it ({exc.strerror or exc}); give a file of 'host slots=N' "
                         "lines") from None
    if len(data) > MAX_HOSTFILE_BYTES:
        raise UsageError(f"--hostfile {path}: over {MAX_HOSTFILE_BYTES >> 20} MiB; give one 'host slots=N' per line")
    try:
        return parse_hostfile(data.decode("utf-8"), default_slots, f"--hostfile {path}")
    except UnicodeDecodeError:
        raise UsageError(f"--hostfile {path}: not UTF-8 text; give one 'host slots=N' per line") from None
    except DiscoveryError as exc:
        raise UsageError(str(exc)) from None


def hosts_flag_of(hosts: dict[str, int]) -> str:
    return ",".join(f"{host}:{slots}" for host, slots in hosts.items())


def timeline_path(flag: str | None, environ: Mapping[str, str]) -> str | None:
    """The timeline file: --timeline, else the first of its environment variables that is set
    (absolute, so that it does not depend on where the rendezvous runs from)."""
    path = flag or next((environ[name] for name in defaults.TIMELINE_ENV if environ.get(name)), None)
    if path is None:
        return None
    if path.upper() == "DYNAMIC":
        raise UsageError("HOROVOD_TIMELINE=DYNAMIC (a timeline started from the script) is not supported; "
                         "give a file: --timeline FILE")
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK) or os.path.isdir(path):
        raise UsageError(f"--timeline {path}: "
                         f"{'that is a folder' if os.path.isdir(path) else f'cannot write in {folder}'}; give a file "
                         "in a folder that exists and is writable")
    return path


def _flag_error(error: Mapping[str, Any]) -> str:
    field = error["loc"][0] if error.get("loc") else ""
    flags = {"min_np": "--min-np", "max_np": "--max-np", "elastic_timeout_s": "--elastic-timeout",
             "checkpoint_every": "--checkpoint-every", "checkpoint_interval_s": "--checkpoint-interval",
             "checkpoint_keep": "--checkpoint-keep", "exit_report_timeout_s": "--exit-report-timeout",
             "spares": f"--spares (or ${defaults.SPARES_ENV})", "timeline": "--timeline",
             "drain_grace_s": "--drain-grace", "notice_interval_s": "--notice-interval",
             "timeline_max_mb": "--timeline-max-mb", "straggler_slowdown": "--straggler-slowdown",
             "straggler_steps": "--straggler-steps"}
    name = str(field)
    flag = flags.get(name) or (f"--{name.removesuffix('_s').replace('_', '-')}" if name else "")
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    return f"{flag}: {message}" if flag else message


#: Warnings the job's end repeats (the newest).
SUMMARY_WARNINGS = 10


def summary_events(outcome: JobOutcome, summary: Summary) -> list[Event]:
    """The job's end as events: one summary (at ERROR when it failed, so that `--log-level
    ERROR` still shows it) and the warnings worth repeating."""
    elapsed = (summary.ended_at or time.monotonic()) - (summary.started_at or time.monotonic())
    said = "stopped by the user" if outcome.interrupted else "succeeded" if outcome.success else "failed"
    events = [Event(Kind.JOB_SUMMARY, {
        "outcome": said, "success": outcome.success, "seconds": elapsed,
        "steps": summary.steps, "steps_lost": summary.steps_lost, "generations": summary.generations,
        "resets": summary.resets, "reason": "" if outcome.interrupted else outcome.message,
    }, level_override=logging.INFO if outcome.success or outcome.interrupted else logging.ERROR)]
    events += [Event(Kind.JOB_WARNING, {"warning": w}) for w in summary.warnings[-SUMMARY_WARNINGS:]]
    return events


def _add_launch_flags(parser: argparse.ArgumentParser) -> None:
    """How `run` reaches its hosts (horovodrun's flags), and what its agents do when a host is taken."""
    add_drain_flags(parser)
    parser.add_argument("--launcher", choices=list(LAUNCHERS), default=None,
                        help="how agents are started: 'ssh' runs each host's agent over ssh (hosts that are this "
                             "machine run here), 'local' runs every host's agent on this machine (hosts emulated by "
                             "name), 'slurm' runs each node's agent as a step of the Slurm job this runs in (srun; "
                             "hosts: the allocation's nodes, SIGUSR1 a preemption: checkpoint, then requeue), 'none' "
                             f"starts none (Kubernetes... start `ringmaster agent`) (default: ${LAUNCHER_ENV}, else "
                             f"slurm inside a Slurm job, else {DEFAULT_LAUNCHER})")
    parser.add_argument("-p", "--ssh-port", dest="ssh_port", type=int, default=None, metavar="P",
                        help="ssh port of the hosts (default: ssh's)")
    parser.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file", default=None, metavar="FILE",
                        help="ssh private key (default: ssh's)")


def choose_addresses(bind: str | None, advertise: str | None, interface: str | None,
                     remote_hosts: list[str]) -> tuple[str, str | None]:
    """(bind, advertise): where the rendezvous listens and what the hosts dial."""
    if interface:
        address = interface_address(interface)
        return bind or address, advertise or address
    if bind is None:
        try:
            bind = route_address(remote_hosts[0]) if remote_hosts else "127.0.0.1"
        except NetworkError as exc:
            raise NetworkError(f"{exc} (hosts are reached over ssh; --launcher local emulates them by name on this "
                               "machine)") from None
    return bind, advertise


def _run_job(args: argparse.Namespace, local_hosts: bool) -> int:
    from ringmaster.rendezvous.server.app import RendezvousServer  # heavy (torch, grpc): not for `scale`
    from ringmaster.rendezvous.state.kv import StoreUnavailable

    if local_hosts:
        args.launcher = choose_launcher(args.launcher, os.environ)
    try:
        heap_problem = heap_choice_error(os.environ)  # (the workers' environment: a typo would go unseen)
        if heap_problem:
            raise UsageError(heap_problem)
        settings, discovery, initial = settings_from_args(args)
        store = parse_store(args.store, args.store_ca, args.store_cert, args.store_key, store_password(args))
        secret, made = job_secret(args.secret_file, local_hosts)
        launcher = args.launcher if local_hosts else "none"
        remote = LAUNCHERS[launcher].remote_hosts(list(initial))
        bind, advertise = choose_addresses(args.bind, args.advertise_address, args.network_interface, remote)
        server_tls = ServerTls.from_files(args.tls_cert, args.tls_key)
        if server_tls is not None:  # the agents `run` starts, here or over ssh, get the CA in their environment
            os.environ[TLS_CA_ENV] = read_pem(args.tls_ca,
                                              "--tls-ca").decode() if args.tls_ca else server_tls.cert.decode()
    except RingmasterError as exc:  # flags, discovery at start, --store, --secret-file, addresses
        print(f"ringmaster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.network_interface:
        os.environ[env_names.GLOO_SOCKET_IFNAME] = os.environ[env_names.NCCL_SOCKET_IFNAME] = args.network_interface
    ssh = SshOptions.from_text(getattr(args, "ssh_port", None), getattr(args, "ssh_identity_file", None),
                               os.environ.get(SSH_OPTIONS_ENV, ""))
    kept = _KeptSecret(secret, made)
    server = RendezvousServer(settings, discovery, bind=bind, port=args.port, api_port=args.api_port,
                              local_hosts=local_hosts, advertise=advertise, store=store, secret=secret,
                              launcher=launcher, ssh=ssh, tls=server_tls, on_api=kept.keep)

    stopped_by: list[int] = []

    def stop_by_user(sig: int) -> None:
        stopped_by.append(sig)
        server.request_stop(f"stopped by the user ({signal.Signals(sig).name})")

    async def main() -> JobOutcome:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop_by_user, sig)
        if launcher == "slurm":  # `#SBATCH --signal=B:USR1@90`: the allocation ends soon (preemption, time limit)
            loop.add_signal_handler(signal.SIGUSR1, server.request_preemption, "SIGUSR1 from Slurm")
        progress = asyncio.create_task(ProgressLine(sys.stdout, sys.stdout.isatty(), time.monotonic).run(server))
        try:
            return await server.run(initial)
        finally:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)

    try:
        outcome = asyncio.run(main())
    except StoreUnavailable as exc:
        print(f"ringmaster: error: cannot reach the store given by --store ({store.describe()}): {exc}",
              file=sys.stderr)
        return 2
    except RingmasterError as exc:  # another leader, a store this version cannot read
        print(f"ringmaster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        kept.remove()
    if server.coordinator is None:
        return 1
    for event in summary_events(outcome, server.coordinator.summary):
        log_event(log, event)
    if outcome.preempted:
        return requeue(os.environ)
    if outcome.interrupted and stopped_by:
        return 128 + stopped_by[0]  # as shells expect of a command stopped by a signal (130 for Ctrl-C)
    return 0 if outcome.success else 1


class _KeptSecret:
    """A secret made here reaches its owner's `scale`, `status` and `events` through a private
    file (`job_files`), removed when the job ends."""

    def __init__(self, secret: str, made: bool) -> None:
        self.secret, self.made = secret, made
        self.saved: list[pathlib.Path] = []

    def keep(self, api_url: str) -> None:
        if not self.made:
            return
        try:
            self.saved.append(save_job_secret(api_url, self.secret))
        except (RingmasterError, OSError) as exc:
            log_event(log, Event(Kind.JOB_WARNING, {"warning": f"the job's secret could not be kept for "
                                                               f"`ringmaster scale` ({exc})"}))
            return
        log_event(log, Event(Kind.JOB_SECRET_SAVED, {"path": str(self.saved[0]), "url": api_url}))

    def remove(self) -> None:
        for path in self.saved:
            remove_job_secret(path)


#: `run`'s exit status after a preemption (EX_TEMPFAIL): for Slurm's `RequeueExit=75`, and for scripts.
PREEMPTED_EXIT = 75


def requeue(environ: Mapping[str, str]) -> int:
    """A preempted job asks Slurm to queue it again (`scontrol requeue`: the job must be
    requeueable, `sbatch --requeue`), to resume from its checkpoint; PREEMPTED_EXIT either way."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        how = "preempted outside a Slurm job: start it again to resume from its checkpoint"
    else:
        import subprocess

        try:
            done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=30)
            how = (f"Slurm job {job_id} requeued: it starts again and resumes from its checkpoint"
                   if done.returncode == 0
                   else f"scontrol requeue {job_id} failed ({done.stderr.strip()[:300]}); submit the job with "
                        "--requeue, or again by hand: it resumes from its checkpoint")
        except (OSError, subprocess.TimeoutExpired) as exc:
            how = (f"scontrol requeue {job_id} could not run ({exc}); submit the job again: it resumes from its "
                   "checkpoint")
    log_event(log, Event(Kind.JOB_REQUEUED, {"how": how, "exit_code": PREEMPTED_EXIT}))
    return PREEMPTED_EXIT


def store_password(args: argparse.Namespace) -> str | None:
    """The store user's password: --store-password-file (mode 600) or $RINGMASTER_STORE_PASSWORD."""
    if args.store_password_file:
        return read_private_file(args.store_password_file, "--store-password-file").strip("\r\n") or None
    return os.environ.get(STORE_PASSWORD_ENV) or None


def job_secret(secret_file: str | None, generate: bool) -> tuple[str, bool]:
    """The secret of the job this process leads: `--secret-file`, `$RINGMASTER_SECRET`, or (for
    `run`, whose agents it starts itself) a new one; and whether it is new (made here)."""
    secret = secret_from(secret_file, os.environ, create=True)
    if secret is not None:
        return secret, False
    if generate:
        return generate_secret(), True
    raise SecretError(
        f"ringmaster serve needs the job secret that its agents will prove: give --secret-file FILE (made if missing; "
        f"copy it to every host and start `ringmaster agent --secret-file FILE`) or set ${SECRET_ENV}"
    )


def unrecognized(unknown: list[str], parser: argparse.ArgumentParser) -> str:
    """`unrecognized arguments: ...`, naming the flag probably meant."""
    flags = [option for action in parser._actions for option in action.option_strings]
    first = next((arg.split("=", 1)[0] for arg in unknown if arg.startswith("-")), None)
    close = difflib.get_close_matches(first, flags, n=1) if first else []
    return f"unrecognized arguments: {' '.join(unknown)}" + (f" (did you mean {close[0]}?)" if close else "")


def _print_agent_key(host: str, secret_file: str | None) -> int:
    problem = host_name_problem(host)
    try:
        if problem:
            raise UsageError(f"HOST: {problem}")
        secret = secret_from(secret_file, os.environ)
        if secret is None:
            raise SecretError(f"the key is derived from the job secret: give --secret-file FILE or set ${SECRET_ENV}")
    except RingmasterError as exc:
        print(f"ringmaster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(agent_key(secret, host).hex())
    return 0


def _remote(args: argparse.Namespace) -> int:
    """The verbs that talk to a running job's control API."""
    try:
        secret = secret_from(args.secret_file, os.environ) or find_job_secret(args.api)
        client = ApiClient(args.api, secret, args.tls_ca)
        if args.verb == "scale":
            return remote.scale(client, args.np, job=args.job)
        if args.verb == "status":
            return remote.status(client, job=args.job)
        if args.job is not None and args.verb in ("drain", "undrain"):
            raise UsageError(f"`ringmaster {args.verb}` takes a host out of one job; a pool's hosts are the pool's: "
                             "drop --job and give the job's own --api")
        if args.verb == "drain":
            return remote.drain(client, args.host, args.deadline)
        if args.verb == "undrain":
            return remote.undrain(client, args.host)
        if args.since < 0:
            raise UsageError(f"--since {args.since}: event numbers start at 0")
        return remote.events(client, args.since, args.follow, args.json, job=args.job)
    except RingmasterError as exc:
        print(f"ringmaster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _picture_verb(args: argparse.Namespace) -> int:
    """`demo` and `plot` (their modules import matplotlib only when called)."""
    try:
        if args.verb == "plot":
            from ringmaster.cli.plot import plot
            return plot(args.log, args.output, args.against)
        from ringmaster.cli.demo import demo
        return demo(args.out, args.quick, args.hold, args.seed)
    except RingmasterError as exc:
        print(f"ringmaster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    skip_teardown_at_exit()  # (the exit of a job's `ringmaster run` is the end of the job for its caller)
    if argv[:1] == ["agent"]:  # the agent's flags are its own (worker/agent/command.py)
        os.execv(sys.executable, [sys.executable, "-m", "ringmaster.worker.agent", *argv[1:]])
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the verb's own parser (its usage), with the flag meant when one is close
        verb_parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.verb]
        verb_parser.error(unrecognized(unknown, verb_parser))
    logs.configure(getattr(args, "log_format", None), getattr(args, "log_level", None))
    if args.verb in ("scale", "drain", "undrain", "status", "events"):
        return _remote(args)
    if args.verb in ("pool", "submit", "jobs", "cancel", "logs"):
        return pool_verbs.main(args)
    if args.verb == "agent-key":
        return _print_agent_key(args.host, args.secret_file)
    if args.verb in ("demo", "plot"):
        return _picture_verb(args)
    return _run_job(args, local_hosts=args.verb == "run")


if __name__ == "__main__":
    sys.exit(main())
