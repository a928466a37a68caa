"""The worker template: real template processes that import torch once and fork workers that
must be indistinguishable, for their script, from a fresh `python script.py` (the spares' probe),
with their own random generators, their exits and signals as the agent sees a process', and
nothing left behind when the template cannot import torch or dies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
from harness import wait_for
from test_spares import PROBE

from ringmaster.common.events import Kind
from ringmaster.worker.agent.starting.template import TEMPLATE_GONE_CODE, ForkedProcess, WorkerTemplate
from ringmaster.worker.agent.starting.template_process import CONTROL_FD_ENV

PY = sys.executable
WAIT_S = 120.0  # (a template imports torch: tens of seconds on a loaded machine)

RANDOMS = "import random, numpy; print(random.random(), numpy.random.random())"


@pytest.fixture
def template_of(tmp_path, monkeypatch):
    """Real templates over this test's folder; every one (and so every worker) killed at teardown."""
    monkeypatch.chdir(tmp_path)
    made: list[WorkerTemplate] = []

    def make(env: dict[str, str] | None = None) -> tuple[WorkerTemplate, list]:
        said: list = []
        template = WorkerTemplate(dict(env if env is not None else os.environ),
                                  lambda kind, **fields: said.append((kind, fields)))
        made.append(template)
        return template, said

    try:
        yield make
    finally:
        for template in made:
            template.close()


def output_of(proc: ForkedProcess) -> tuple[str, str]:
    """Everything a forked worker wrote, once it ended."""
    got: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda name=name, pipe=pipe: got.__setitem__(name, pipe.read()))
               for name, pipe in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    proc.wait(WAIT_S)
    for reader in readers:
        reader.join(WAIT_S)
    return got["out"].decode(), got["err"].decode()


def test_a_forked_worker_is_indistinguishable_from_a_fresh_python_and_keeps_its_exit_code(
        template_of, tmp_path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    template, said = template_of({**os.environ, "PROBE_EXIT": "3"})
    assert template.ready(WAIT_S), said
    env = {**os.environ, "RANK": "1", "RINGMASTER_WORKER_ID": "hostA/2", "PROBE_EXIT": "3"}
    argv = [PY, "probe.py", "--epochs", "3"]
    proc, why = template.fork(argv, env, "hostA/2")
    assert proc is not None, why
    out, err = output_of(proc)
    assert proc.returncode == 3, err
    fresh = subprocess.run(argv, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=WAIT_S)
    assert fresh.returncode == 3
    as_forked, as_fresh = json.loads(out), json.loads(fresh.stdout)
    assert as_forked == as_fresh
    assert as_forked["argv"] == ["probe.py", "--epochs", "3"] and as_forked["env"]["RANK"] == "1"
    assert [kind for kind, _ in said] == [Kind.TEMPLATE_READY] and said[0][1]["pid"] == template.proc.pid
    assert os.getppid() != template.proc.pid and proc.pid != template.proc.pid

    # What it cannot be starts fresh, and the template stays.
    for argv, env, reason in (
        (["/bin/echo", "hi"], env, "is not this agent's Python"),
        ([PY, "-u", "probe.py"], env, "interpreter options"),
        ([PY, "probe.py"], {**env, "PYTHONHASHSEED": "7"}, "differs from the spare's in PYTHONHASHSEED"),
    ):
        proc, why = template.fork(argv, env, "h/0")
        assert proc is None and reason in why, (argv, why)
    assert template.usable


@pytest.mark.slow  # (a template's imports: with the end-to-end tests)
def test_forked_workers_draw_their_own_random_numbers_and_stop_by_signal_as_processes_do(template_of, tmp_path) -> None:
    (tmp_path / "randoms.py").write_text(RANDOMS)
    (tmp_path / "sleeps.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    template, said = template_of()
    assert template.ready(WAIT_S), said
    drawn = []
    for worker in ("h/0", "h/1"):
        proc, why = template.fork([PY, "randoms.py"], dict(os.environ), worker)
        assert proc is not None, why
        out, err = output_of(proc)
        assert proc.returncode == 0, err
        drawn.append(out.split())
    assert drawn[0][0] != drawn[1][0] and drawn[0][1] != drawn[1][1], drawn  # Python's and NumPy's own
    proc, why = template.fork([PY, "sleeps.py"], dict(os.environ), "h/2")
    assert proc is not None, why
    assert proc.stdout.readline() == b"up\n"
    assert proc.poll() is None
    os.kill(template.proc.pid, signal.SIGTERM)  # as a drain's SIGTERM to the whole host: for the workers only
    os.kill(template.proc.pid, signal.SIGINT)
    again, why = template.fork([PY, "randoms.py"], dict(os.environ), "h/3")
    assert again is not None and output_of(again)[1] == "" and again.returncode == 0, why
    assert template.usable and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT_S) == -signal.SIGTERM
    proc.send_signal(signal.SIGKILL)  # (ended: nothing is sent, nothing raised)


def test_a_template_that_cannot_import_torch_is_said_once_and_not_used(template_of, tmp_path) -> None:
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "torch.py").write_text("raise ImportError('no torch on this host')\n")
    template, said = template_of({**os.environ, "PYTHONPATH": str(fake)})
    assert not template.ready(WAIT_S) and not template.usable
    wait_for(lambda: said, WAIT_S, "the template's failure said")
    assert [kind for kind, _ in said] == [Kind.TEMPLATE_OFF] and "exit code 3" in said[0][1]["reason"], said
    proc, why = template.fork([PY, "x.py"], dict(os.environ), "h/0")
    assert proc is None and "exit code 3" in why


@pytest.mark.slow  # (a second template's imports: with the end-to-end tests)
def test_workers_die_with_their_template_and_are_reported_killed(template_of, tmp_path) -> None:
    (tmp_path / "sleeps.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    template, said = template_of()
    assert template.ready(WAIT_S), said
    proc, why = template.fork([PY, "sleeps.py"], dict(os.environ), "h/0")
    assert proc is not None, why
    assert proc.stdout.readline() == b"up\n"
    template.proc.kill()
    assert proc.wait(WAIT_S) == TEMPLATE_GONE_CODE
    wait_for(lambda: not os.path.exists(f"/proc/{proc.pid}") or _state(proc.pid) in "ZX", WAIT_S, "the worker gone")
    assert not template.usable and [kind for kind, _ in said] == [Kind.TEMPLATE_READY, Kind.TEMPLATE_OFF]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


@pytest.mark.slow  # (a template's imports: with the end-to-end tests)
def test_malformed_requests_are_refused_one_by_one_and_the_template_goes_on(tmp_path) -> None:
    """Only the agent holds the template's socket, but what comes on it is still parsed as
    untrusted: each malformed request gets its error, the descriptors sent with it are closed,
    and the template stays up for the next."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([PY, "-m", "ringmaster.worker.agent.starting.template_process"], cwd=tmp_path,
                            env={**os.environ, CONTROL_FD_ENV: str(theirs.fileno())}, pass_fds=(theirs.fileno(),),
                            start_new_session=True, stdin=subprocess.DEVNULL)
    theirs.close()
    try:
        ours.settimeout(WAIT_S)
        assert json.loads(ours.recv(1 << 16)) == {"ready": True}
        sent: set[str] = set()  # the pipes whose ends went with the requests, as /proc names them
        requests = [
            (b"\xff not json", "UnicodeDecodeError"),
            (b"[1, 2]", "TypeError"),
            (json.dumps({"assignment": {}}).encode(), "KeyError"),
            (json.dumps({"ask": 7, "assignment": {}}).encode(), "needs the worker's stdout and stderr"),
            (b"[" * 10_000 + b"]" * 10_000, "RecursionError"),  # (nested deeper than Python recurses)
        ]
        for data, error in requests:
            out, err = os.pipe()
            sent.add(f"pipe:[{os.fstat(out).st_ino}]")
            try:
                socket.send_fds(ours, [data], [out, err] if error != "needs the worker's stdout and stderr" else [out])
            finally:
                os.close(out)
                os.close(err)
            reply = json.loads(ours.recv(1 << 16))
            assert set(reply) == {"ask", "error"} and error in reply["error"], (data[:40], reply)
        assert reply["ask"] is None
        for bad in ({"ask": 8, "assignment": "no"}, {"ask": 9, "assignment": {"argv": 3}}):
            out, err = os.pipe()
            sent.add(f"pipe:[{os.fstat(out).st_ino}]")
            socket.send_fds(ours, [json.dumps(bad).encode()], [out, err])
            os.close(out)
            os.close(err)
            reply = json.loads(ours.recv(1 << 16))
            assert reply["ask"] == bad["ask"] and "error" in reply, reply
        assert proc.poll() is None, "the template died of a request"
        kept = set()
        for fd in os.listdir(f"/proc/{proc.pid}/fd"):
            with contextlib.suppress(OSError):
                kept.add(os.readlink(f"/proc/{proc.pid}/fd/{fd}"))
        assert not kept & sent, "descriptors sent with refused requests were kept"
    finally:
        ours.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(WAIT_S)
