"""The per-host agent: keeps the host's training processes equal to what the rendezvous wants.

It opens a session with the rendezvous, heartbeats on an interval, starts the workers the
rendezvous lists for this host, stops (SIGTERM, then SIGKILL after a grace) the ones it no
longer lists, and reports every exit with its code or signal. Workers stay in the agent's
process group and die with it, so on one machine an agent's group is an emulated host.

Run as `ringmaster agent --rendezvous HOST:PORT[,HOST:PORT...] [--host NAME]` on a real host.
When it loses the rendezvous (restarted, or failed over to a standby) it keeps its workers
running and reconnects to the listed addresses in turn, with backoff, for up to
`--reconnect-timeout` seconds; exits that happened meanwhile are reported once it is back.

Told to stop by a signal (SIGTERM, SIGINT: Kubernetes, Slurm, a person) while it runs workers,
it asks the rendezvous to drain its host (`DrainHost`) and keeps them until they have left at a
commit or `--drain-grace` ends, then exits 0; a second signal stops them at once. A preemption
notice (`notice.py`: its script, or SIGUSR1) drains the host without ending the agent.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import queue
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

# The agent never forks itself to run Python: its processes (fresh workers, the template, spares)
# are exec'd by subprocess, and the template (a process of its own) forks the workers. gRPC's fork
# handlers would only cost each of those starts.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc

from ringmaster import __version__
from ringmaster.common import logs
from ringmaster.common.dial import dial
from ringmaster.common.events import Event, Kind
from ringmaster.common.grpc_auth import Credentials, Unproven
from ringmaster.common.heartbeats import paced_interval
from ringmaster.common.keys import AGENT, Identity
from ringmaster.common.reconnect import Backoff
from ringmaster.proto import environment as env_names
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.settings import EXIT_REPORT_RPC_TIMEOUT_S, AgentSettings
from ringmaster.worker.agent.beat_relay import BeatCollector
from ringmaster.worker.agent.event_relay import EventForwarder
from ringmaster.worker.agent.exit_reports import ExitReports
from ringmaster.worker.agent.host_drain import DrainAsk, HostDrain
from ringmaster.worker.agent.leftovers import folder_prefix, remove_dead_agents_folders
from ringmaster.worker.agent.notice import NoticeWatcher
from ringmaster.worker.agent.process_watch import ProcessWatch
from ringmaster.worker.agent.ready_relay import ReadyCarrier
from ringmaster.worker.agent.starting.spare_pool import SparePool
from ringmaster.worker.agent.starting.template import ForkedProcess, WorkerTemplate
from ringmaster.worker.agent.starting.threads import THREADS_ENV, usable_cpus, worker_threads
from ringmaster.worker.agent.starting.warm_join import warm_before_joining
from ringmaster.worker.agent.starting.ways import StartRequest, start_worker, ways_for
from ringmaster.worker.agent.worker_environment import ahead_environment, worker_environment

#: Seconds between two looks at the children and the command queue.
POLL_S = 0.02
#: Seconds between two looks at the warm spares (memory, replacements).
TEND_SPARES_S = 0.5


_logger = logging.getLogger(logs.AGENT)


def say(host: str, kind: Kind, **fields: object) -> None:
    """Log one of this agent's events; the console line names the host."""
    event = Event(kind, {"host": host, **fields})
    _logger.log(event.level, event.message, extra={"event": event, "host": host})


@dataclass(frozen=True)
class WorkerSpec:
    """A worker the rendezvous wants, as this host runs it: its command and environment values
    back from the bytes they travel as (`os.fsdecode`: an argument that is not UTF-8 is the
    same bytes again when the worker is started, and in its `sys.argv` as Python holds it)."""

    worker_id: str
    slot: int
    argv: tuple[str, ...]
    env: dict[str, str]

    @classmethod
    def of(cls, message: pb.WorkerSpec) -> "WorkerSpec":
        return cls(message.worker_id, message.slot, tuple(os.fsdecode(a) for a in message.argv),
                   {name: os.fsdecode(value) for name, value in message.env.items()})


@dataclass
class _Child:
    spec: WorkerSpec
    proc: subprocess.Popen | ForkedProcess
    kill_at: float | None = None  # set once asked to stop


class Agent:
    def __init__(self, settings: AgentSettings, key: bytes | None = None,
                 on_stopping: Callable[[float], None] | None = None, ca_pem: bytes | None = None,
                 spares: SparePool | None = None) -> None:
        """`key`: this host's agent key (`keys.agent_key`); calls are signed with it, only a
        rendezvous that proves it is obeyed, and each worker gets its own key derived from it
        (never this one). `on_stopping(bound_s)` is called once the agent begins to stop: the
        stop should take at most `bound_s` seconds (the CLI arms an exit watchdog with it)."""
        self.key = key
        self.say = functools.partial(say, settings.host)  # say(kind, **fields): this agent's events
        self.credentials = Credentials(Identity(AGENT, settings.host), key) if key is not None else None
        self.incarnation = secrets.token_hex(16)  # this process' sessions, told apart from another agent's
        self.ca_pem = ca_pem  # the CA the rendezvous' TLS certificate chains to (None: no TLS)
        self.addresses = list(settings.rendezvous)
        self.host = settings.host
        self.heartbeat_interval_s = self._base_interval_s = settings.heartbeat_interval_s
        self.stop_grace_s = settings.stop_grace_s
        self.reconnect_timeout_s = settings.reconnect_timeout_s
        self.children: dict[str, _Child] = {}
        self._running: tuple[str, ...] = ()  # ids of live children, readable from the session thread
        self._pids: tuple[tuple[str, int], ...] = ()  # (id, pid) of live children, for the heartbeat thread
        self._watch = ProcessWatch()  # which of them the kernel shows busy (the heartbeat thread's)
        self._started: set[str] = set()  # a worker id is one process: never start it twice
        self._unstartable: list[tuple[str, str]] = []  # (worker, why) could not be started: exit code 127
        self.exits = ExitReports(self.say)
        self._commands: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._stub: pb_grpc.RendezvousStub | None = None
        self._session = None
        self._channel: grpc.Channel | None = None
        self._retired: queue.Queue = queue.Queue()  # (channel, close after): lost sessions' channels
        self._on_stopping = on_stopping
        self._reader = threading.Thread(target=self._read_sessions, daemon=True)
        self._heartbeater = threading.Thread(target=self._heartbeat, daemon=True)
        self.slots = settings.slots  # offered to a job that takes its hosts from agents
        self.warm_join = settings.warm_join and spares is None
        if spares is not None:  # warmed before this agent knew its job (`warm_ahead`): its spares from now on
            self.spares = spares
            spares.count, spares._env = settings.spares, lambda: self._worker_env({}, None)
        else:
            self.spares = SparePool(settings.spares, lambda: self._worker_env({}, None), _forward_output, self.say)
        self._spares_tended = 0.0
        self._fork_workers = settings.fork_workers
        self._warmed_ahead = spares is not None  # its first workers start in those spares; the template later
        self.template: WorkerTemplate | None = None  # started with the agent (`run`)
        # How a worker is started: warm spare, template fork, cold spare, fresh (starting/ways.py).
        self._ways = ways_for(self.spares, self._template_for_fork, self.say, _forward_output)
        self.drain_grace_s = settings.drain_grace_s
        self._signals = 0  # stop signals received (the second one stops at once)
        self.drain = HostDrain(self.host, settings.drain_grace_s, self.say)
        # Where a worker is marked before this agent sends it SIGTERM (host_signals.py).
        removed = remove_dead_agents_folders()  # (those of agents killed before they could)
        if removed:
            say(self.host, Kind.AGENT_LEFTOVERS_REMOVED, count=len(removed))
        self._stops_dir = tempfile.mkdtemp(prefix=folder_prefix("stops"))
        # Where a large job's workers send their heartbeats and `Ready`s for this agent to carry, and
        # where it hands them the job's messages, carried in its own (beat_relay.py, ready_relay.py,
        # event_relay.py).
        self._beats = BeatCollector(self._worker_of)
        relays = self._beats.folder if self._beats.available else ""
        self._events = EventForwarder(relays, self._pid_of)
        self._readies = ReadyCarrier(relays, self.host, self._worker_of, lambda: len(self.children), lambda: self._stub,
                                     lambda worker, reason: say(self.host, Kind.AGENT_READY_REFUSED, worker=worker,
                                                                reason=reason))
        self._notices = NoticeWatcher(settings.notice_script, settings.notice_interval_s, self._noticed,
                                      lambda problem: say(self.host, Kind.AGENT_NOTICE_FAILED, problem=problem),
                                      self._stop,
                                      {**os.environ, env_names.HOST: self.host}) if settings.notice_script else None

    @property
    def _last_call_s(self) -> float:
        """The longest a call already started on a channel can still run."""
        return max(self.heartbeat_interval_s * 5, EXIT_REPORT_RPC_TIMEOUT_S) + 1.0

    @property
    def stop_bound_s(self) -> float:
        """The longest a stop may take: the workers' grace, a late exit report, the heartbeat
        and session threads' last calls, and a margin."""
        return self.stop_grace_s + 1.0 + 2 * EXIT_REPORT_RPC_TIMEOUT_S + self._last_call_s + 10.0

    def run(self) -> int:
        if self._fork_workers and not self._warmed_ahead:  # warming while the agent says hello and the job forms
            self._start_template()
        if self.warm_join:  # (a host joining a running job: its first workers start warm)
            warm = warm_before_joining(self.template, self.spares, self.slots, lambda: not self._commands.empty())
            if warm:
                say(self.host, Kind.AGENT_WARM, **warm)
        self._reader.start()
        self._heartbeater.start()
        if self._notices is not None:
            self._notices.start()
        exit_code = 0
        try:
            while True:
                command = self._next_command()
                if command is _REFUSED:
                    exit_code = 2
                    break
                if command is _LOST:
                    say(self.host, Kind.AGENT_GAVE_UP, addresses=", ".join(self.addresses),
                        timeout_s=self.reconnect_timeout_s)
                    exit_code = 1
                    break
                if isinstance(command, DrainAsk):
                    if not self.drain.begin(command, len(self.children), self._stub):
                        break
                    continue
                if command is not None:
                    if command.shutdown:
                        say(self.host, Kind.AGENT_STOPPING, reason=command.reason or "the rendezvous ended the job")
                        self.exits.nobodys_news = True  # the rendezvous wants no more of this host's news
                        break
                    self._apply(command.workers)
                self._reap()
                self._events.retry()
                self.drain.send(self._stub)
                if self.drain.left(len(self.children), bool(self.exits.unsent)):
                    break
                self._close_retired()
                if time.monotonic() - self._spares_tended >= TEND_SPARES_S:
                    self._spares_tended = time.monotonic()
                    self.spares.tend()
        finally:
            if self._on_stopping is not None:
                self._on_stopping(self.stop_bound_s)
            self._stop_all()
            self._readies.close()  # (before the channel closes: its last call may still run)
            self._close()
            shutil.rmtree(self._stops_dir, ignore_errors=True)
            self._beats.close()
            self._events.close()
        return exit_code

    def _worker_of(self, pid: int) -> str | None:
        """The worker this agent started as process `pid` (read from the beats thread)."""
        for worker_id, child in list(self.children.items()):
            if child.proc.pid == pid:
                return worker_id
        return None

    def _pid_of(self, worker_id: str) -> int | None:
        """The process this agent started for `worker_id` (read from the session thread)."""
        child = self.children.get(worker_id)
        return child.proc.pid if child is not None else None

    def _close(self) -> None:
        """End the session from this one thread, once no other thread uses its channel: closing a
        gRPC channel while another thread has a call on it can deadlock the process."""
        self._stop.set()  # after the last exit report
        session = self._session
        if session is not None:
            session.cancel()  # wakes the session thread if it still reads
        self._heartbeater.join(timeout=self._last_call_s)
        self._reader.join(timeout=EXIT_REPORT_RPC_TIMEOUT_S)
        self._stub = None
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()  # an open channel can hold up the interpreter's exit
        self._close_retired(everything=True)

    def _close_retired(self, everything: bool = False) -> None:
        """Close lost sessions' channels whose last calls are over (all of them when stopping)."""
        now = time.monotonic()
        while not self._retired.empty():
            channel, close_after = self._retired.queue[0]
            if not everything and close_after > now:
                return
            self._retired.get()
            channel.close()

    def request_stop(self, reason: str = "agent interrupted") -> None:
        self._commands.put(pb.AgentCommand(shutdown=True, reason=reason))

    def signalled(self, signum: int) -> None:
        """A stop signal (from a signal handler): the first drains the host, the next stops now."""
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            self._commands.put(DrainAsk(name, self.drain_grace_s))
        else:
            self.request_stop(f"{name} again: stopping the workers now")

    def notice(self, ask: DrainAsk) -> None:
        """A preemption notice (or its withdrawal), from the notice watcher or SIGUSR1."""
        self._commands.put(ask)

    def _noticed(self, seconds: float | None) -> None:
        if seconds is None:
            self.notice(DrainAsk("notice withdrawn", 0.0, notice=True, withdraw=True))
        else:
            self.notice(DrainAsk(f"notice: this host goes away in {seconds:g} s", max(seconds, 0.1), notice=True))

    # -------------------------------------------------------------- threads
    def _read_sessions(self) -> None:
        """Hold a session with whichever listed rendezvous answers; reconnect when it is lost."""
        backoff = Backoff(self.reconnect_timeout_s)
        while not self._stop.is_set():
            dialed = dial(self.addresses, backoff, self._stop, self.credentials, self.ca_pem)
            if dialed is None:
                if not self._stop.is_set():
                    self._commands.put(_LOST)
                return
            address, channel = dialed
            self._channel = channel
            stub = pb_grpc.RendezvousStub(channel)
            session = stub.AgentSession(pb.AgentHello(host=self.host, pid=os.getpid(), running=list(self._running),
                                                      incarnation=self.incarnation, slots=self.slots,
                                                      carries_events=self._events.available,
                                                      shares_events=self._events.available,
                                                      shares_places=self._events.available, version=__version__))
            self._session = session
            over = False
            try:
                for command in session:
                    if self._stub is not stub:
                        self._stub = stub
                        backoff.reset()
                        say(self.host, Kind.AGENT_SESSION, address=address)
                    if command.events:  # (its workers' messages: handed over at once, from this thread)
                        self._events.forward(command.events)
                        continue
                    self._commands.put(command)
                    if command.shutdown:
                        over = True  # the job is over: nothing to reconnect to
                        break
            except Unproven as exc:  # something posing as the rendezvous: never obeyed, the next address is tried
                say(self.host, Kind.AGENT_UNPROVEN, address=address, error=exc.details())
            except grpc.RpcError as exc:
                if exc.code() in _REFUSED_FOR_GOOD:  # a bad --host, another agent's host, the wrong secret
                    error = exc.details() or str(exc.code())
                    if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
                        error += ("; start the agent with the job's secret (--secret-file or $RINGMASTER_SECRET) or "
                                  "its host's key (--agent-key-file)")
                    say(self.host[:80], Kind.AGENT_REFUSED, address=address, error=error)
                    self._commands.put(_REFUSED)
                    session.cancel()
                    return  # the main thread closes the channel
            if not over and not self._stop.is_set() and self._stub is stub:
                say(self.host, Kind.AGENT_LOST_RENDEZVOUS, address=address)
            if over or self._stop.is_set():
                return  # the main thread still reports its workers' exits on this channel, then closes it
            self._stub = None
            session.cancel()
            self._channel = None
            # Lost: the next dial opens a new channel. Another thread may still have a call on
            # this one, so the main thread closes it once those calls have timed out.
            self._retired.put((channel, time.monotonic() + self._last_call_s))

    def _heartbeat(self) -> None:
        """Heartbeat, and fence: an agent that has heard nothing from any rendezvous for its
        reconnect window (a partition can leave its session's connection silently dead) stops
        its workers, so a cut-off host never trains on beside the ones that replaced it."""
        last_contact = time.monotonic()
        while not self._stop.wait(self.heartbeat_interval_s):
            stub = self._stub
            if stub is not None:
                try:
                    relayed = self._beats.take(set(self._running)) if self._beats.relaying else []
                    busy = self._watch.busy(self._pids)
                    answer = stub.AgentHeartbeat(pb.AgentHeartbeatRequest(host=self.host, workers=relayed, busy=busy),
                                                 timeout=self.heartbeat_interval_s * 5)
                    last_contact = time.monotonic()
                    self._beats.relay(answer.relay_beats)
                    # A large job's rendezvous asks for a longer interval; within a third of the
                    # reconnect window, so that fencing still follows a lost rendezvous.
                    self.heartbeat_interval_s = paced_interval(answer.heartbeat_interval_s, self._base_interval_s,
                                                               self.reconnect_timeout_s / 3)
                    continue
                except (grpc.RpcError, ValueError):
                    pass  # a closed session is noticed by _read_sessions (ValueError: its channel closed)
            if time.monotonic() - last_contact > self.reconnect_timeout_s:
                self._commands.put(_LOST)
                return

    def _next_command(self):
        try:
            return self._commands.get(timeout=POLL_S)
        except queue.Empty:
            return None

    # -------------------------------------------------------------- children
    def _track_children(self) -> None:
        """Publish the live children for the other threads (one assignment each: no lock)."""
        self._running = tuple(self.children)
        self._pids = tuple((worker_id, child.proc.pid) for worker_id, child in self.children.items())

    def _apply(self, specs: Iterable[pb.WorkerSpec]) -> None:
        wanted = {spec.worker_id: WorkerSpec.of(spec) for spec in specs}
        for worker_id, child in self.children.items():
            if worker_id not in wanted and child.kill_at is None:
                self._terminate(child)
        for worker_id, spec in wanted.items():
            if worker_id not in self._started:
                self._started.add(worker_id)
                try:
                    self.children[worker_id] = _Child(spec, self._spawn(spec, len(wanted)))
                    self._track_children()
                except OSError as exc:
                    error = str(exc)
                    if isinstance(exc, PermissionError) and exc.filename:
                        error += f" (is it executable? chmod +x {exc.filename})"
                    say(self.host, Kind.PROCESS_START_FAILED, worker=worker_id, error=error)
                    self._unstartable.append((worker_id, error))

    def _worker_env(self, spec_env: Mapping[str, str], worker_id: str | None) -> dict[str, str]:
        """A worker's environment (`worker_environment`)."""
        return worker_environment(spec_env, worker_id, self.key, self._stops_dir,
                                  self._beats.folder if self._beats.available else "", self.ca_pem, self.addresses)

    def _spawn(self, spec: WorkerSpec, workers_here: int) -> subprocess.Popen | ForkedProcess:
        """Start worker `spec`, one of `workers_here` this agent runs now (their share of the cores)."""
        env = self._worker_env(spec.env, spec.worker_id)
        threads = worker_threads({**os.environ, **spec.env}, workers_here, usable_cpus())
        if threads is not None:
            env[THREADS_ENV] = threads
        say(self.host, Kind.PROCESS_STARTED, worker=spec.worker_id, slot=spec.slot, command=shlex.join(spec.argv))
        program = spec.argv[0] if spec.argv else ""
        if not program or shutil.which(program, path=env.get("PATH")) is None:
            # Said here as Popen itself would say it: the exec happens behind setpriv (dying_with_parent).
            if os.sep in program and os.path.isfile(program):
                raise PermissionError(errno.EACCES, "Permission denied", program)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
        return start_worker(self._ways, StartRequest(list(spec.argv), env, spec.worker_id))

    def _start_template(self) -> None:
        self.template = WorkerTemplate(self._worker_env({}, None), self.say)

    def _template_for_fork(self) -> WorkerTemplate | None:
        """The worker template to fork from (started now if the agent has none yet), or None
        where this agent forks no workers."""
        if self.template is None and self._fork_workers:
            self._start_template()
        return self.template

    def _terminate(self, child: _Child) -> None:
        if child.proc.poll() is not None:
            return  # it died by itself: its exit is its own, reported as such
        child.kill_at = time.monotonic() + self.stop_grace_s
        self._mark(child)
        _signal(child.proc, signal.SIGTERM)

    def _mark(self, child: _Child) -> None:
        """Say that the SIGTERM coming is this agent's own: the worker ends at once (host_signals.py)."""
        try:
            with open(os.path.join(self._stops_dir, str(child.proc.pid)), "x"):
                pass
        except OSError:
            pass  # marked already, or the folder is gone: the SIGKILL after the grace still comes

    def _reap(self) -> None:
        while self._unstartable:
            worker_id, error = self._unstartable.pop()
            self.exits.add(pb.WorkerExit(host=self.host, worker_id=worker_id, exit_code=127, output=error[:1000]))
        now = time.monotonic()
        for worker_id, child in list(self.children.items()):
            code = child.proc.poll()
            if code is None:
                if child.kill_at is not None and now >= child.kill_at:
                    _signal(child.proc, signal.SIGKILL)
                continue
            del self.children[worker_id]
            self._track_children()
            exit_code, sig = (0, -code) if code < 0 else (code, 0)
            # Stopped by us only if our signal ended it (it may have crashed just before it came).
            ours = child.kill_at is not None and sig in (signal.SIGTERM, signal.SIGKILL)
            self.exits.add(pb.WorkerExit(host=self.host, worker_id=worker_id, exit_code=exit_code, signal=sig,
                                              stopped_by_agent=ours,
                                              output=last_words(child.proc.pid, failed=exit_code != 0 and not ours)))
        self.exits.send(self._stub)

    def _stop_all(self) -> None:
        self.spares.close()
        for child in self.children.values():
            if child.kill_at is None:
                self._terminate(child)
        deadline = time.monotonic() + self.stop_grace_s + 1.0
        while self.children and time.monotonic() < deadline:
            self._reap()
            time.sleep(POLL_S)
        for child in self.children.values():
            _signal(child.proc, signal.SIGKILL)
            child.proc.wait()
        if self.template is not None:  # (after its workers: their exits come through it)
            self.template.close()


#: Answers that retrying cannot change: the agent exits (code 2) naming them.
_REFUSED_FOR_GOOD = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNAUTHENTICATED)
_LOST = object()
_REFUSED = object()
_OUTPUT_LOCK = threading.Lock()


@dataclass
class _StderrTail:
    """The last lines a process wrote to stderr, and whether its stderr has ended."""

    lines: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_TAIL_LINES))
    ended: threading.Event = field(default_factory=threading.Event)


#: Lines of a worker's stderr kept to say why it failed, and how long its end is waited for.
_TAIL_LINES = 3
_TAIL_WAIT_S = 0.5
_TAILS: dict[int, _StderrTail] = {}  # pid -> its stderr's tail (until its exit is reported)


def warm_ahead(slots: int, host: str) -> SparePool:
    """Spares started before the agent knows its job (`--await-order`, a pool's ready agent): one
    per slot, warming while it waits for its order, so the job's first workers here start warm.
    Their environment is the one a worker gets less its job's own variables, as `take` checks."""
    pool = SparePool(0, ahead_environment, _forward_output, lambda kind, **fields: say(host, kind, **fields))
    pool.warm_for_join(slots)
    pool.tend()
    return pool


def _forward_output(proc: subprocess.Popen | ForkedProcess, prefix: list[str]) -> None:
    """Copy a worker's stdout and stderr to ours, each line prefixed with `prefix[0]` as it is
    when the line comes (a warm spare's changes when it becomes a worker); keep stderr's tail."""
    tail = _TAILS[proc.pid] = _StderrTail()
    threading.Thread(target=_forward, args=(proc.stdout, sys.stdout, prefix, None), daemon=True).start()
    threading.Thread(target=_forward, args=(proc.stderr, sys.stderr, prefix, tail), daemon=True).start()


def _forward(pipe, sink, prefix: list[str], tail: _StderrTail | None) -> None:
    """Copy a worker's output line by line, prefixed with its id, so workers never interleave mid-line."""
    for raw in iter(pipe.readline, b""):
        text = raw.decode(errors="replace").rstrip("\n")
        if tail is not None and text.strip():
            tail.lines.append(text.strip()[:400])
        with _OUTPUT_LOCK:
            sink.write(prefix[0] + text + "\n")
            sink.flush()
    pipe.close()
    if tail is not None:
        tail.ended.set()


def last_words(pid: int, failed: bool) -> str:
    """What a process that ended wrote last to stderr (after an error; waiting a moment for its
    last lines to be read), and forget it."""
    tail = _TAILS.pop(pid, None)
    if tail is None or not failed:
        return ""
    tail.ended.wait(_TAIL_WAIT_S)
    return " | ".join(tail.lines)[-1000:]


def _signal(proc: subprocess.Popen | ForkedProcess, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass
