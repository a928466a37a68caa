"""The agent's command line: `ringmaster agent ...` and `python -m ringmaster.worker.agent ...`.

Its flags come from `AgentSettings`, the one definition `ringmaster run` uses for the agents it
starts; a bad value is named by its flag.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading

from pydantic import ValidationError

from ringmaster import settings as defaults
from ringmaster.common import logs
from ringmaster.common.errors import RingmasterError
from ringmaster.common.handover import MAX_HANDOVER_BYTES, handed_rendezvous, read_handover
from ringmaster.common.keys import agent_key, parse_key
from ringmaster.common.processes import die_with_parent, exit_if_stuck
from ringmaster.common.reconnect import parse_addresses
from ringmaster.common.secret import SECRET_ENV, read_private_file, secret_from
from ringmaster.common.tls import TLS_CA_ENV, read_pem
from ringmaster.discovery import host_name_problem
from ringmaster.proto import environment as env_names
from ringmaster.settings import FORK_WORKERS_ENV, SPARES_ENV, AgentSettings
from ringmaster.worker.agent.daemon import Agent, DrainAsk, warm_ahead
from ringmaster.worker.agent.flags import add_drain_flags
from ringmaster.worker.agent.slots import default_slots
from ringmaster.worker.agent.starting.heap import heap_choice_error

DESCRIPTION = "The per-host agent: keeps the host's training processes equal to what the rendezvous wants."
EXAMPLE = ("example:\n  ringmaster agent --secret-file job.secret --rendezvous rdzv-host:29400 --host node1\n"
           "  (on node1, for a job whose rendezvous `ringmaster serve` runs on rdzv-host)")


def build_parser() -> argparse.ArgumentParser:
    """`ringmaster agent`'s flags (the documentation's reference is generated from them too)."""
    parser = argparse.ArgumentParser(prog="ringmaster agent", description=DESCRIPTION, epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rendezvous", default=None, metavar="HOST:PORT",
                        help="HOST:PORT of the rendezvous; several, comma-separated, for a rendezvous with standbys")
    parser.add_argument("--host", default=socket.gethostname(),
                        metavar="NAME", help="this host's name as discovery lists it (default: hostname)")
    parser.add_argument("--heartbeat-interval", type=float, default=defaults.DEFAULT_HEARTBEAT_INTERVAL_S, metavar="S",
                        help="seconds (default: %(default)s)")
    parser.add_argument("--stop-grace", type=float, default=defaults.DEFAULT_STOP_GRACE_S, metavar="S",
                        help="seconds between SIGTERM and SIGKILL (default: %(default)s)")
    parser.add_argument("--reconnect-timeout", type=float, default=None, metavar="S",
                        help="seconds to keep trying to reach a lost rendezvous before stopping the workers (default: "
                             f"${env_names.RECONNECT_TIMEOUT}, which the workers read too, else "
                             f"{defaults.DEFAULT_RECONNECT_TIMEOUT_S:g})")
    parser.add_argument("--spares", type=int, default=None, metavar="N",
                        help=f"warm spare worker processes to keep ready, so a newcomer skips Python's and torch's "
                             f"start (default: ${SPARES_ENV}, else {defaults.DEFAULT_SPARES}; 0: none)")
    parser.add_argument("--fork-workers", action=argparse.BooleanOptionalAction, default=None,
                        help="fork `python script.py` workers from one warm process that imported torch once, instead "
                             f"of starting each fresh (default: on; ${FORK_WORKERS_ENV}=0 turns it off)")
    parser.add_argument("--slots", type=int, default=None, metavar="N",
                        help="slots this host offers a job whose rendezvous takes hosts from agents "
                             "(`--hosts-from-agents`); a job that lists its hosts takes their slots from the list "
                             "(default: the GPUs this host sees, else 1)")
    parser.add_argument("--warm-join", action=argparse.BooleanOptionalAction, default=None,
                        help="before connecting, warm a spare for every slot (torch imported), so the first workers "
                             "this host is given start in a fraction of a second (default: on, except for the agents "
                             "`ringmaster run` starts, whose first workers start the job)")
    add_drain_flags(parser)
    parser.add_argument("--secret-file", default=None, metavar="FILE",
                        help=f"the job secret (as given to `ringmaster serve`; mode 600): the agent derives its host's "
                             f"key from it and forgets it. Default: ${SECRET_ENV}")
    parser.add_argument("--agent-key-file", default=None, metavar="FILE",
                        help="instead of the secret: this host's own key (mode 600), as `ringmaster agent-key HOST` "
                             "prints it; it lets this agent act for this host only")
    parser.add_argument("--tls-ca", default=None, metavar="FILE",
                        help=f"the CA that the rendezvous' TLS certificate chains to: speak TLS to it (default: "
                             f"${TLS_CA_ENV}, the PEM itself; else plain gRPC)")
    # How `ringmaster run` starts its agents (the host's key and the environment on the first line
    # of stdin, stopping when stdin closes; dying with `run`): not for people.
    parser.add_argument("--from-launcher", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)
    # A pool's host agent starts one ahead of need: it warms a spare per slot, then waits for its
    # order (the handover, naming the rendezvous too) before it connects.
    parser.add_argument("--await-order", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--log-level", type=str.upper, choices=logs.LEVELS, default=None,
                        help=f"(default: ${logs.LOG_LEVEL_ENV}, else {logs.DEFAULT_LEVEL})")
    parser.add_argument("--log-format", type=str.lower, choices=logs.FORMATS, default=None,
                        help=f"text or json, one object per line (default: ${logs.LOG_FORMAT_ENV}, else "
                             f"{logs.DEFAULT_FORMAT})")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = host_name_problem(args.host)
    if problem:
        parser.error(f"--host: {problem}")
    handed: str | None = None
    warmed = None
    if args.await_order:
        if not args.from_launcher:
            parser.error("--await-order is for agents a pool's host agent starts (--from-launcher)")
        logs.configure(args.log_format, args.log_level)
        if args.die_with_parent:
            die_with_parent(os.getppid())
        warmed = warm_ahead(args.slots if args.slots is not None else default_slots(os.environ), args.host)
    if args.from_launcher:
        line = sys.stdin.buffer.readline(MAX_HANDOVER_BYTES + 1)
        try:
            handed, environment = read_handover(line)
        except ValueError as exc:
            if warmed is not None:
                warmed.close()
            parser.error(str(exc))
        if args.await_order:
            args.rendezvous = handed_rendezvous(line)
        os.environ.update(environment)  # the launching environment, as horovodrun forwards it
    if not args.rendezvous:
        parser.error("--rendezvous HOST:PORT is required")
    heap_problem = heap_choice_error(os.environ)
    if heap_problem:
        parser.error(heap_problem)
    logs.configure(args.log_format, args.log_level)
    if args.die_with_parent:
        die_with_parent(os.getppid())
    try:
        settings = AgentSettings(rendezvous=parse_addresses(args.rendezvous), host=args.host,
                                 heartbeat_interval_s=args.heartbeat_interval, stop_grace_s=args.stop_grace,
                                 reconnect_timeout_s=args.reconnect_timeout if args.reconnect_timeout is not None else
                                 os.environ.get(env_names.RECONNECT_TIMEOUT) or defaults.DEFAULT_RECONNECT_TIMEOUT_S,
                                 spares=args.spares if args.spares is not None else
                                 os.environ.get(SPARES_ENV) or defaults.DEFAULT_SPARES,
                                 fork_workers=args.fork_workers if args.fork_workers is not None else
                                 os.environ.get(FORK_WORKERS_ENV, "1") != "0",
                                 drain_grace_s=args.drain_grace, notice_script=args.preemption_notice_script,
                                 notice_interval_s=args.notice_interval,
                                 slots=args.slots if args.slots is not None else default_slots(os.environ),
                                 warm_join=args.warm_join if args.warm_join is not None else not args.from_launcher)
    except ValidationError as exc:
        flags = {"rendezvous": "--rendezvous", "host": "--host", "heartbeat_interval_s": "--heartbeat-interval",
                 "stop_grace_s": "--stop-grace", "reconnect_timeout_s": "--reconnect-timeout",
                 "spares": f"--spares (or ${SPARES_ENV})", "drain_grace_s": "--drain-grace",
                 "notice_interval_s": "--notice-interval", "notice_script": "--preemption-notice-script",
                 "slots": "--slots"}
        problems = "; ".join(
            f"{flags.get(str(e['loc'][0]), e['loc'][0]) if e['loc'] else ''}: {e['msg']}" for e in exc.errors()
        )
        parser.error(problems)
    try:
        key = _agent_key(handed, args.agent_key_file, args.secret_file, settings.host)
    except (RingmasterError, ValueError) as exc:
        parser.error(str(exc))
    if key is None:
        parser.error(f"the agent needs the job secret of its rendezvous (--secret-file FILE or ${SECRET_ENV}) or its "
                     "host's key (--agent-key-file FILE)")
    try:
        ca_pem = read_pem(args.tls_ca,
                          "--tls-ca") if args.tls_ca else (os.environ.get(TLS_CA_ENV) or "").encode() or None
    except RingmasterError as exc:
        parser.error(str(exc))
    agent = Agent(settings, key, on_stopping=exit_if_stuck, ca_pem=ca_pem, spares=warmed)
    # A stop signal drains the host (its workers leave at their next commit); a second stops now.
    signal.signal(signal.SIGTERM, lambda signum, _: agent.signalled(signum))
    signal.signal(signal.SIGINT, lambda signum, _: agent.signalled(signum))
    # Slurm's `--signal=B:USR1@90` and the like: a preemption notice, the drain grace from now.
    signal.signal(signal.SIGUSR1, lambda *_: agent.notice(DrainAsk("SIGUSR1: preemption notice", settings.drain_grace_s,
                                                                   notice=True)))
    if args.from_launcher:
        threading.Thread(target=_stop_when_closed, args=(agent,), daemon=True).start()
    return agent.run()


def _agent_key(handed: str | None, key_file: str | None, secret_file: str | None, host: str) -> bytes | None:
    """This host's agent key: handed over by the launcher, read from --agent-key-file, or derived
    from the job secret (--secret-file, $RINGMASTER_SECRET), which is then dropped from this
    process' environment so no worker inherits it."""
    if handed:
        return parse_key(handed, "the launcher's handover")
    if key_file:
        return parse_key(read_private_file(key_file, "--agent-key-file"), f"--agent-key-file {key_file}")
    secret = secret_from(secret_file, os.environ)
    os.environ.pop(SECRET_ENV, None)
    return agent_key(secret, host) if secret is not None else None


def _stop_when_closed(agent: Agent) -> None:
    """The launcher's connection (ssh) is this agent's lifeline: when stdin ends, stop."""
    while sys.stdin.buffer.read(4096):
        pass
    agent.request_stop("the launcher's connection closed")

