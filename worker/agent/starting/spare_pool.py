"""Warm spares: worker processes an agent starts ahead of need (see `spare_process.py`).

A newcomer taken from a spare costs its script's own start (building the model), not the
interpreter's and torch's (about 2.5 s of CPU here). A spare is used only where it cannot be
told from a fresh process by the script:
- the command is `PYTHON script.py ...` or `PYTHON -m module ...` with the very interpreter the
  spare runs (no interpreter options: `-u`, `-X`, `-W` start a worker fresh);
- its environment differs from the spare's only in the variables Ringmaster itself sets for a
  worker (`proto/environment.py`, its key, the CA), which nothing reads at import time, and
  the agent's thread count (OMP_NUM_THREADS, `threads.py`), which the spare applies itself.
Otherwise the worker starts fresh, as without spares. Spares run no user code before they are
assigned, hold no slot, are at most `count` per agent, each within `max_rss_bytes` (a spare
that grows past it is stopped). They never share the CPU with a worker's start-up: spares are
started `fresh_hold_s` after the agent last started a worker fresh (its imports take seconds of
CPU; an agent's first workers are always fresh), and not before every worker it started fresh has
used `STARTUP_CPU_S` of CPU, its start-up's cost (or ended, or `MAX_FRESH_HOLD_S` passed). A
hold in seconds alone ran out on a loaded machine while the first workers were still importing:
4 spares then imported beside them, and the demo's 4 workers had trained no step after 60 s
(CI). A used spare is replaced `replace_after_s` after its use. Spares that die before use three
times in a row (an environment without torch) turn spares off for this agent, said once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ringmaster.common.events import Kind
from ringmaster.common.keys import WORKER_KEY_ENV
from ringmaster.common.processes import dying_with_parent
from ringmaster.common.tls import TLS_CA_ENV
from ringmaster.proto import environment as env_names
from ringmaster.worker.agent.process_watch import read_stat
from ringmaster.worker.agent.starting.spare_process import READY_FD_ENV, Assignment

#: A spare holding more resident memory than this is stopped (torch imported: about 250 MB).
DEFAULT_MAX_RSS_BYTES = 2 << 30
#: Seconds after a spare is used before its replacement starts.
DEFAULT_REPLACE_AFTER_S = 2.0
#: Seconds after a worker started fresh before spares start.
DEFAULT_FRESH_HOLD_S = 10.0
#: CPU seconds a worker started fresh uses for its start-up, so that spares start only after it:
#: CPU time, unlike the clock, is the same on a loaded machine. An interpreter and torch's imports
#: take 2.3-2.8 s here, a script's own imports and model on top of them more (the demo's: 4-5 s);
#: a worker that trains passes it within seconds anyway.
STARTUP_CPU_S = 5.0
#: Seconds after which a worker started fresh no longer holds spares back, whatever its CPU time
#: (a worker that waits for something at its start).
MAX_FRESH_HOLD_S = 120.0
#: Spares that die unused in a row before spares are turned off for the agent.
MAX_FAILURES = 3
#: Variables a worker's environment may hold that a spare's did not (or with other values).
WORKER_VARIABLES = frozenset(
    {value for name, value in vars(env_names).items() if name.isupper() and isinstance(value, str)}
    # (and the thread count, env_names.THREADS: the spare applies it, spare_process.become)
    | {WORKER_KEY_ENV, TLS_CA_ENV}
)


def spare_assignment(argv: list[str], env: Mapping[str, str], cwd: str, spare_env: Mapping[str, str],
                     interpreter: str = sys.executable) -> tuple[Assignment | None, str]:
    """(the assignment that turns a spare into the worker `argv` with `env`, "") or (None, why a
    spare cannot be it). `spare_env` is the environment the spare was started with."""
    if not argv:
        return None, "no command"
    program = shutil.which(argv[0], path=env.get("PATH"))
    if program is None or not same_interpreter(program, interpreter):
        return None, f"the command's program {argv[0]} is not this agent's Python ({interpreter})"
    if len(argv) >= 3 and argv[1] == "-m":
        kind, target, args = "module", argv[2], list(argv[3:])
    elif len(argv) >= 2 and not argv[1].startswith("-"):
        kind, target, args = "script", argv[1], list(argv[2:])
        path = os.path.join(cwd, target)
        if not os.path.isfile(path) or zipfile.is_zipfile(path):
            return None, f"{target} is not a script file"  # started fresh, so Python itself says what it is
    else:
        return (
            None,
            "the command gives the interpreter options (only `python script.py` and `python -m module` are warm)",
        )
    differing = sorted(name for name in set(env) | set(spare_env)
                       if env.get(name) != spare_env.get(name) and name not in WORKER_VARIABLES)
    if differing:
        return None, f"the worker's environment differs from the spare's in {', '.join(differing[:5])}"
    return Assignment(kind, target, args, dict(env), cwd), ""


def same_interpreter(program: str, interpreter: str) -> bool:
    """Whether `program` starts the Python `interpreter` is: the same file once links are
    resolved (`.venv/bin/python` and `.venv/bin/python3` are one), named from the same folder
    (a virtual environment's `python` and the base interpreter it links to are one file, but
    the folder's `pyvenv.cfg` makes them two Pythons with their own packages)."""
    left, right = os.path.abspath(program), os.path.abspath(interpreter)
    return os.path.dirname(left) == os.path.dirname(right) and os.path.realpath(left) == os.path.realpath(right)


def cpu_seconds_of(pid: int) -> float | None:
    """The CPU time (user and system) process `pid` used, None once it is gone."""
    sample = read_stat(pid)
    return None if sample is None or sample.state in "ZXx" else sample.cpu_ticks / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass
class _Spare:
    proc: subprocess.Popen
    env: dict[str, str]
    started: float
    ready_pipe: int | None  # our end of the pipe on which it says it is warm; None once it did
    ready_s: float | None = None  # seconds its imports took
    on_output: list[str] = field(default_factory=lambda: ["[spare] "])  # its output's prefix, set when used

    def poll_ready(self, now: float) -> bool:
        """True the first time the spare is seen warm."""
        if self.ready_pipe is None:
            return False
        try:
            said = os.read(self.ready_pipe, 1)
        except BlockingIOError:
            return False
        os.close(self.ready_pipe)
        self.ready_pipe = None
        if said:
            self.ready_s = now - self.started
        return bool(said)

    def forget(self) -> None:
        if self.ready_pipe is not None:
            os.close(self.ready_pipe)
            self.ready_pipe = None


class SparePool:
    """The agent's spares. Not thread-safe: the agent's main thread owns it."""

    def __init__(self, count: int, env: Callable[[], dict[str, str]],
                 forward: Callable[[subprocess.Popen, list[str]], None],
                 say: Callable[..., None], max_rss_bytes: int = DEFAULT_MAX_RSS_BYTES,
                 replace_after_s: float = DEFAULT_REPLACE_AFTER_S, fresh_hold_s: float = DEFAULT_FRESH_HOLD_S,
                 clock: Callable[[], float] = time.monotonic,
                 cpu_seconds: Callable[[int], float | None] = cpu_seconds_of) -> None:
        """`env()`: the environment of a worker before its own variables (what spares start with).
        `forward(proc, prefix)` copies a process' output with a changeable prefix. `say(kind, **fields)`.
        `cpu_seconds(pid)`: the CPU time a process used, None once it is gone."""
        self.count = count
        self._env = env
        self._forward = forward
        self._say = say
        self._max_rss = max_rss_bytes
        self._replace_after_s = replace_after_s
        self._fresh_hold_s = fresh_hold_s
        self._clock = clock
        self._cpu_seconds = cpu_seconds
        self._starting: dict[int, float] = {}  # workers started fresh, still starting: pid -> when
        self.idle: list[_Spare] = []
        self._next_start: float | None = None  # None: no worker started yet, so no spare either
        self._failures = 0
        self.used = 0
        self._join_target = 0  # spares wanted warm before the agent joins (`warm_for_join`)

    def take(self, argv: list[str], env: dict[str, str], worker_id: str) -> subprocess.Popen | None:
        """A spare turned into worker `worker_id`, or None (start it fresh) when none fits."""
        self._drop_dead()
        while self.idle:
            spare = self.idle.pop(0)
            assignment, why = spare_assignment(argv, env, os.getcwd(), spare.env)
            if assignment is None:
                self._say(Kind.SPARE_UNFIT, worker=worker_id, reason=why)
                self.idle.append(spare)  # it may fit the next worker; this one starts fresh
                return None
            # Its output is the worker's from before the assignment goes: a script that prints at
            # once (on a loaded host, before this thread runs again) is labelled with the worker.
            spare.on_output[0] = f"[{worker_id}] "
            try:
                assert spare.proc.stdin is not None
                spare.proc.stdin.write(assignment.to_line())
                spare.proc.stdin.close()
            except (BrokenPipeError, ValueError, OSError):
                _kill(spare)
                continue  # it died meanwhile: try the next
            self._join_target = 0  # the host's first workers are here: back to `count` spares
            spare.poll_ready(self._clock())
            spare.forget()
            self.used += 1
            self._failures = 0
            self.hold(self._replace_after_s)
            self._say(Kind.SPARE_USED, worker=worker_id, pid=spare.proc.pid, warm=spare.ready_s is not None,
                      age_s=round(self._clock() - spare.started, 2))
            return spare.proc
        return None

    def warm_for_join(self, count: int) -> None:
        """Start `count` spares now (at least `self.count`), for the first workers of a host that
        joins: they are kept until used, and the pool goes back to `self.count` at the first use."""
        if count <= 0:
            return
        self._join_target = count
        self.hold(0.0)

    def warm(self) -> int:
        """Idle spares that are warm (torch imported)."""
        return sum(1 for spare in self.idle if spare.ready_s is not None)

    def started_fresh(self, pid: int) -> None:
        """The agent started worker process `pid` without a spare just now: no spare starts beside
        its start-up (for `fresh_hold_s`, and until it used `STARTUP_CPU_S` of CPU)."""
        self._starting[pid] = self._clock()
        self.hold(self._fresh_hold_s)

    def _workers_starting(self) -> bool:
        """Whether a worker started fresh is still in its start-up (forgets those that are not)."""
        now = self._clock()
        for pid, started in list(self._starting.items()):
            used = self._cpu_seconds(pid)
            if used is None or used >= STARTUP_CPU_S or now - started >= MAX_FRESH_HOLD_S:
                del self._starting[pid]
        return bool(self._starting)

    def hold(self, seconds: float = 0.0) -> None:
        """Start no spare in the next `seconds` (the first call lets spares start at all)."""
        later = self._clock() + seconds
        self._next_start = later if self._next_start is None else max(self._next_start, later)

    def tend(self) -> None:
        """Replace what was used or died, and stop spares grown too big (called every poll)."""
        if max(self.count, self._join_target) <= 0:
            return
        self._drop_dead()
        for spare in list(self.idle):
            if spare.poll_ready(self._clock()):
                self._say(Kind.SPARE_READY, pid=spare.proc.pid, took_s=round(spare.ready_s or 0.0, 2))
            size = rss_bytes(spare.proc.pid)
            if size > self._max_rss:
                self.idle.remove(spare)
                _kill(spare)
                self._say(Kind.SPARE_TOO_BIG, pid=spare.proc.pid, rss_mb=size >> 20, limit_mb=self._max_rss >> 20)
        wanted = max(self.count, self._join_target)
        if len(self.idle) >= wanted or self._workers_starting():
            return
        while self._next_start is not None and len(self.idle) < wanted and self._clock() >= self._next_start:
            self._start()

    def close(self) -> None:
        """Stop every idle spare (the agent is stopping)."""
        for spare in self.idle:
            _kill(spare)
        self.idle.clear()

    def _start(self) -> None:
        env = self._env()
        ours, theirs = os.pipe()
        os.set_blocking(ours, False)
        try:
            proc = subprocess.Popen(dying_with_parent([sys.executable,
                                                       "-m", "ringmaster.worker.agent.starting.spare_process"]),
                                    env={**env, READY_FD_ENV: str(theirs)}, pass_fds=(theirs,),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            os.close(ours)
            self._failed(f"cannot start: {exc}")
            return
        finally:
            os.close(theirs)
        spare = _Spare(proc, env, self._clock(), ours)
        self._forward(proc, spare.on_output)
        self.idle.append(spare)

    def _drop_dead(self) -> None:
        for spare in list(self.idle):
            code = spare.proc.poll()
            if code is not None:
                self.idle.remove(spare)
                spare.forget()
                self._failed(f"exited with code {code} before it was used")

    def _failed(self, why: str) -> None:
        self._failures += 1
        self.hold(self._replace_after_s)
        if self._failures >= MAX_FAILURES:
            self._say(Kind.SPARE_OFF, reason=why, failures=self._failures)
            self.count = 0
            self.close()


def _kill(spare: _Spare) -> None:
    spare.forget()
    proc = spare.proc
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
