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
from ringmaster.cli.job_files import find_job_secret, remove_job_secret, save_job_secret
from ringmaster.cli.pool_flags import TOKEN_ENV
from ringmaster.cli.remote import table
from ringmaster.common.api_client import ApiClient, ApiError
from ringmaster.common.errors import RingmasterError, UsageError
from ringmaster.common.secret import SECRET_ENV, generate_secret, read_private_file, read_secret_file, secret_from
from ringmaster.launch.launch_plan import SSH_OPTIONS_ENV, SshOptions, choose_launcher


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

    from ringmaster.common import logs
    from ringmaster.common.events import emitter
    from ringmaster.common.handover import MAX_HANDOVER_BYTES, read_handover
    from ringmaster.common.keys import parse_key, pool_host_key
    from ringmaster.common.processes import die_with_parent
    from ringmaster.discovery.parse import MAX_SLOTS_PER_HOST, host_name_problem
    from ringmaster.worker.agent.pool_agent import run_pool_agent
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


def _pool_source(args: argparse.Namespace) -> tuple[Any, Any, str | None]:
    """Where the pool's hosts come from (-H, a discovery script, or a board that pool agents join
    with keys derived from the join secret): (the source, the board or None, the join secret or None).
    A bad host list or script refuses to start here."""
    from ringmaster.discovery import HostDiscovery, ScriptDiscovery, StaticDiscovery, parse_hosts_flag
    from ringmaster.rendezvous.pool.host_board import HostBoard

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
    source.find_hosts()
    return source, board, join_secret


async def _serve_api(app: Any, args: argparse.Namespace, server_tls: Any) -> tuple[Any, asyncio.Task, str]:
    """The pool's control API, listening: (its server, the task serving it, its URL)."""
    import uvicorn

    config = uvicorn.Config(app, host=args.bind, port=args.api_port, log_level="warning", lifespan="off",
                            ssl_certfile=server_tls.cert_file if server_tls else None,
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
    return api, serving, f"{'https' if server_tls else 'http'}://{args.advertise_address or args.bind}:{port}"


def _job_settings(args: argparse.Namespace) -> dict[str, object]:
    """The settings every job of the pool gets (JobSettings' fields)."""
    if not 0 < args.checkpoint_interval <= 86_400:
        raise UsageError(f"--checkpoint-interval {args.checkpoint_interval:g}: seconds, more than 0 and at most a day")
    return {"spares": args.spares, "warmup_grace_s": args.warmup_grace, "start_timeout_s": args.start_timeout,
            "drain_grace_s": args.drain_grace, "discovery_interval_s": 0.2, "stragglers": args.stragglers,
            "straggler_slowdown": args.straggler_slowdown, "checkpoint_interval_s": args.checkpoint_interval}


def serve(args: argparse.Namespace) -> int:
    from ringmaster.common import logs
    from ringmaster.common.events import Kind, emitter
    from ringmaster.common.tls import TLS_CA_ENV, ServerTls, read_pem
    from ringmaster.rendezvous.pool.api import create_pool_app
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
    source, board, join_secret = _pool_source(args)
    tokens = parse_queue_tokens(read_private_file(args.queue_tokens, "--queue-tokens", 1 << 20),
                                {"default", *rules.queue_weights}) if args.queue_tokens else {}
    secret = secret_from(args.secret_file, os.environ, create=True)
    made = secret is None
    secret = secret or generate_secret()
    job_settings = _job_settings(args)
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
        ssh = SshOptions.from_text(args.ssh_port, args.ssh_identity_file, os.environ.get(SSH_OPTIONS_ENV, ""))
        pool = PoolService(source, args.policy, rules, job_settings, pathlib.Path(args.checkpoint_root).resolve(), say,
                           launcher=launcher, ssh=ssh, bind=args.bind,
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
        api, serving, url = await _serve_api(create_pool_app(pool, secret, tokens), args, server_tls)
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
