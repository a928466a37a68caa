"""Running real `ringmaster run` jobs from tests: every process is reaped, even on failure.

The launcher runs in its own session; agents run in sessions of their own (they are emulated
hosts) and die with the launcher (PR_SET_PDEATHSIG), workers die with their agent. Teardown
kills the launcher's group and every agent group it ever reported, so nothing outlives a test.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Callable, TypeVar

from ringmaster.common.grpc_auth import Credentials
from ringmaster.common.keys import AGENT, WORKER, Identity, key_of
from ringmaster.common.secret import SECRET_ENV, generate_secret
from ringmaster.launch.launch_plan import LAUNCHER_ENV
from ringmaster.settings import SPARES_ENV

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "tests" / "workloads"
# One job secret for every job the tests start (in the environment, which `serve`, `agent` and
# `scale` read, and which each process started here inherits).
os.environ.setdefault(SECRET_ENV, generate_secret())
SECRET = os.environ[SECRET_ENV]
# Hosts in most tests are names emulated on this machine; the SSH tests give --launcher ssh.
os.environ.setdefault(LAUNCHER_ENV, "local")
# No warm spares unless a test asks: each is an interpreter importing torch (about 3 s of CPU) per
# emulated host, and a run of the suite warmed 120 and used 41, on two cores its jobs shared. The
# tests of spares, the chaos schedule and the demo run with the product's own default.
os.environ.setdefault(SPARES_ENV, "0")
#: A job's environment with the product's own spares (unset: `--spares`' default).
PRODUCT_SPARES: dict[str, str | None] = {SPARES_ENV: None}
#: Headers of a control API change (`POST /scale`).
API_HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {SECRET}"}
T = TypeVar("T")


def credentials(host: str, worker: str | None = None, secret: str | None = None) -> Credentials:
    """What the agent of `host` (or, given `worker`, that worker) signs its calls with in a job
    of `secret` (default: the tests' own)."""
    identity = Identity(WORKER, host, worker) if worker else Identity(AGENT, host)
    return Credentials(identity, key_of(secret or SECRET, identity))


#: Ports the tests choose come from a band below the kernel's ephemeral range (where every port
#: bound to 0 by the product, etcd or gRPC lands), one slice of it per pytest-xdist worker: a
#: port the kernel picked for one test was once handed to a test in the other worker between its
#: choice and its bind, and gRPC's SO_REUSEPORT let both servers listen on it. (Below 20000 lie
#: Ray's worker ports, 10002-19999 by default.)
PORT_BAND = (20000, 32768)
_next_port: list[int] = []


def _port_slice() -> tuple[int, int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), index + 1)
    width = (PORT_BAND[1] - PORT_BAND[0]) // count
    return PORT_BAND[0] + index * width, PORT_BAND[0] + (index + 1) * width


def free_port(address: str = "127.0.0.1") -> int:
    """A port nobody holds now on `address` (loopback unless said), from this worker's slice of `PORT_BAND`, taken in
    turn (a port just given up is not handed out again at once)."""
    low, high = _port_slice()
    if not _next_port:
        _next_port.append(low + (os.getpid() * 7919) % (high - low))  # (a process of its own: elsewhere)
    for _ in range(high - low):
        port = _next_port[0]
        _next_port[0] = low + (port + 1 - low) % (high - low)
        with socket.socket() as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {address} in {low}..{high - 1}")


#: The jobs started since the current test began (`conftest` empties it between tests): a wait
#: fails at once when one of them failed by itself (`failed_job`).
WATCHED_JOBS: list["Job"] = []


def failed_job() -> "Job | None":
    """A watched job that failed (it said `job.failed` and exited with a code above 0) without
    the test asking for its exit (`Job.wait`): whatever a test waits for, it will not come from a
    job that failed. (A rendezvous that stopped leading, or was killed, is no failed job.)"""
    for job in list(WATCHED_JOBS):
        code = job.proc.poll()
        if code is not None and code > 0 and not job.exit_expected:
            job._reader.join(timeout=5)  # (its last lines)
            if job.events("job.failed"):
                return job
    return None


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy; fail naming `what` at the deadline,
    or at once, with its story and last lines, when a job of the test failed meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        failed = failed_job()
        if failed is not None:
            value = condition()  # (once more: its last lines came in meanwhile)
            if value:
                return value
            raise AssertionError(f"while waiting for {what}, `ringmaster {failed.verb}` exited with code "
                                 f"{failed.proc.returncode}:\n{failed.story()}\n--- its last lines:\n"
                                 + "\n".join(failed.lines[-40:]))
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


#: What a copy of the checkout leaves out: what git ignores and a build or an install would pick
#: up (.git stays: the version comes from it).
NOT_COPIED = (".venv", "build", "dist", "site", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
              ".mypy_cache", "_version.py")


def copy_checkout(destination: pathlib.Path) -> pathlib.Path:
    """A clean copy of this checkout at `destination`, as a fresh clone has it (with what is not
    committed yet): for tests that build, install or set up from it."""
    import shutil

    shutil.copytree(ROOT, destination, ignore=shutil.ignore_patterns(*NOT_COPIED))
    return destination


def commit_log(log: pathlib.Path) -> list[dict]:
    """The commits `workloads/paced_job.py`'s rank 0 logged to `log` so far, read while it writes
    (a line being written is left for the next read)."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines(keepends=True) if line.endswith("\n")]


def write_hosts(path: pathlib.Path, hosts: dict[str, int]) -> None:
    """Atomically replace the host file a discovery script prints."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{h}:{s}\n" for h, s in hosts.items()))
    os.replace(tmp, path)


def discovery_script(directory: pathlib.Path, hosts: dict[str, int]) -> tuple[pathlib.Path, pathlib.Path]:
    """A discovery script printing a host file the test can rewrite."""
    hosts_file = directory / "hosts.txt"
    write_hosts(hosts_file, hosts)
    script = directory / "hosts.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, hosts_file


class Job:
    """A `ringmaster run` process and what it printed. It logs JSON lines (RINGMASTER_LOG_FORMAT,
    which its agents and workers inherit), so tests look at event kinds and fields."""

    def __init__(self, args: list[str], env: dict[str, str | None] | None = None, verb: str = "run",
                 preexec: Callable[[], None] | None = None, prefix: list[str] | None = None,
                 program: list[str] | None = None, cwd: pathlib.Path | None = None) -> None:
        """`prefix` goes before the command (`ip netns exec NAME` runs it on a namespace host);
        `program` is the `ringmaster` command run (this checkout's by default, an installed one's
        `bin/ringmaster` where a test tries what users install), from `cwd` (the checkout by default)."""
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", RINGMASTER_LOG_FORMAT="json")
        full_env.update(env or {})
        full_env = {name: value for name, value in full_env.items() if value is not None}  # None: unset it
        self.proc = subprocess.Popen(
            [*(prefix or []), *(program or [sys.executable, "-m", "ringmaster.cli"]), verb, *args],
            cwd=cwd or ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=preexec,
        )
        self.verb = verb
        self.exit_expected = False  # set once the test waits for its exit (`wait`)
        WATCHED_JOBS.append(self)
        self.lines: list[str] = []
        self._agent_pids: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.api_url: str | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def events(self, kind: str | None = None, **match: object) -> list[dict]:
        """The events logged so far (by the rendezvous, agents and workers), oldest first, of
        `kind` with the given field values; a worker's carry `from` (its id)."""
        found = []
        for line in list(self.lines):
            record = parse_event_line(line)
            if record is not None and (kind is None or record.get("kind") == kind) \
                    and all(record.get(k) == v for k, v in match.items()):
                found.append(record)
        return found

    #: The events that tell how a job's rings went (for `story`).
    STORY_KINDS = ("generation.formed", "generation.over", "worker.failed", "worker.exited", "host.lost",
                   "host.blacklisted", "host.spared", "host.kept_for_commit", "commits.lost", "job.succeeded",
                   "job.failed", "rendezvous.stalled", "agent.stopping", "agent.gave_up",
                   # a pool's: where its jobs went, and why its hosts left
                   "pool.job_started", "pool.job_resized", "pool.job_suspending", "pool.agent_stops",
                   "pool.agent_trouble", "pool.host_blacklisted", "pool.host_agent_ended", "pool.host_lapsed",
                   "pool.stalled")

    def story(self) -> str:
        """How the job's rings went, one short line per event, seconds from the first event: an
        assertion message that leads with it shows the cause where a long output is cut."""
        events = self.events()
        start = events[0].get("time", 0.0) if events else 0.0
        return "\n".join(f"+{e.get('time', start) - start:.2f} s {e['kind']}: {str(e.get('message', ''))[:160]}"
                         for e in events if e.get("kind") in self.STORY_KINDS)

    def wait_event(self, kind: str, timeout_s: float = 60, **match: object) -> dict:
        """The first event of `kind` with the given field values, waited for."""

        def find() -> dict | None:
            found = self.events(kind, **match)
            if found:
                return found[0]
            if self.proc.poll() is not None:
                raise AssertionError(f"ringmaster exited early ({self.proc.returncode}):\n{self.output}")
            return None

        return wait_for(find, timeout_s, f"a {kind} event with {match}")

    def wait_line(self, marker: str, timeout_s: float = 60) -> str:
        """What follows `marker` on the first output line that has it."""

        def find() -> str | None:
            for line in list(self.lines):
                if marker in line:
                    return line.split(marker, 1)[1].strip()
            if self.proc.poll() is not None:
                raise AssertionError(f"ringmaster exited early ({self.proc.returncode}):\n{self.output}")
            return None

        return wait_for(find, timeout_s, f"a line with {marker!r}")

    def wait_api(self, timeout_s: float = 60) -> str:
        self.api_url = str(self.wait_event("api.listening", timeout_s)["url"])
        return self.api_url

    def status(self) -> dict:
        url = self.api_url or self.wait_api()
        request = urllib.request.Request(f"{url}/status", headers={"Authorization": API_HEADERS["Authorization"]})
        with urllib.request.urlopen(request, timeout=5) as response:
            status = json.load(response)
        self._agent_pids.update(h["agent_pid"] for h in status["hosts"] if h["agent_pid"])
        return status

    def wait_status(self, predicate: Callable[[dict], bool], timeout_s: float, what: str) -> dict:
        def check() -> dict | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"ringmaster exited ({self.proc.returncode}) while waiting for "
                                     f"{what}:\n{self.output}")
            try:
                status = self.status()
            except OSError:
                return None
            return status if predicate(status) else None

        return wait_for(check, timeout_s, what, interval_s=0.1)

    def kill_host(self, host: str, sig: int = signal.SIGKILL) -> int:
        """SIGKILL an emulated host (or send it `sig`): its agent's whole process group."""
        pid = next(h["agent_pid"] for h in self.status()["hosts"] if h["name"] == host)
        os.killpg(pid, sig)
        return pid

    def wait(self, timeout_s: float) -> int:
        self.exit_expected = True
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ringmaster did not finish within {timeout_s:g} s:\n{self.output}") from None
        self._reader.join(timeout=5)
        # A worker's exit status is its script's: SIGABRT at exit (a thread woken during the
        # interpreter's finalization) never passes unnoticed.
        assert not [e for e in self.events() if e.get("signal") == 6], f"a worker died by SIGABRT:\n{self.output}"
        return code

    def kill(self) -> None:
        for pid in [self.proc.pid, *self._agent_pids]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()

    def save_output(self, path: pathlib.Path) -> None:
        """Write what the process printed to `path` (once it ended: the reader has it all)."""
        self._reader.join(timeout=5)
        path.write_text(self.output + "\n")


def parse_event_line(line: str) -> dict | None:
    """An event from one line of a job's output (a worker's line starts with `[its id] `)."""
    source = None
    if line.startswith("[") and "] {" in line:
        source, line = line[1:].split("] ", 1)
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or "kind" not in record:
        return None
    if source is not None:
        record["from"] = source
    return record


def read_logs(log_dir: pathlib.Path) -> dict[str, list[dict]]:
    """Per worker: the JSON lines the workload wrote, read while it writes (a line not yet ended,
    or cut short by a worker killed as it wrote, is not a record)."""
    logs = {}
    for path in sorted(log_dir.glob("*.jsonl")):
        logs[path.stem] = [json.loads(line) for line in path.read_text().splitlines(keepends=True)
                           if line.endswith("\n") and line.strip()]
    return logs


def events(logs: dict[str, list[dict]], kind: str) -> list[dict]:
    return [dict(r, worker=w) for w, records in logs.items() for r in records if r["event"] == kind]


def first_commit_at(log_dir: pathlib.Path, size: int, after: float = 0.0, worker_prefix: str = "") -> float | None:
    """When the first step was committed at world size `size` after `after` (time.time()), by a
    worker whose log name starts with `worker_prefix`; None while there is none (for `wait_for`)."""
    return min((r["time"] for name, records in read_logs(log_dir).items() if name.startswith(worker_prefix)
                for r in records if r["event"] == "commit" and r["size"] == size and r["time"] > after), default=None)


#: Flags that keep elastic test jobs quick: discovery polled often, newcomers given time to warm up.
FAST = ["--discovery-interval", "0.3", "--warmup-grace", "10", "--start-timeout", "20"]


def elastic_job(log_dir: pathlib.Path, epochs: int = 3, samples: int = 96, step_time: float = 0.08) -> list[str]:
    log_dir.mkdir(exist_ok=True)
    return ["python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(log_dir),
            "--epochs", str(epochs), "--samples", str(samples), "--step-time", str(step_time)]


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """A job's Prometheus metrics: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": API_HEADERS["Authorization"]})
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
