"""Warm spares: which workers a spare may become (pure), and real spare processes that must be
indistinguishable, for the script they run, from a fresh `python script.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from harness import wait_for

from ringmaster.common.events import Kind
from ringmaster.worker.agent.starting.spare_pool import SparePool, rss_bytes, spare_assignment
from ringmaster.worker.agent.starting.spare_process import MAX_ASSIGNMENT_BYTES, parse_assignment

PY = sys.executable

#: What a script can see of how it was started.
PROBE = textwrap.dedent("""
    import json, os, signal, sys
    seen = {k: repr(v) for k, v in globals().items() if k.startswith("__") and k not in ("__builtins__", "__loader__")}
    seen["loader"] = type(globals().get("__loader__")).__name__
    seen["builtins"] = type(globals()["__builtins__"]).__name__
    print(json.dumps({
        "argv": sys.argv, "globals": seen, "path0": sys.path[0], "cwd": os.getcwd(), "env": dict(os.environ),
        "main_is_this": sys.modules["__main__"].__dict__ is globals(),
        "signals": {s: repr(signal.getsignal(getattr(signal, s)))
                    for s in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGCHLD", "SIGUSR1")},
        "stdin": sys.stdin.read(),
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),  # (the thread running the script)
    }, sort_keys=True))
    sys.stdout.flush()
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
""")


def test_a_python_script_or_module_with_the_same_environment_fits(tmp_path) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    env = {"PATH": os.environ["PATH"], "HOME": "/root"}
    worker_env = {**env, "RANK": "3", "RINGMASTER_WORKER_ID": "h/4", "RINGMASTER_WORKER_KEY": "ab" * 32}
    assignment, why = spare_assignment([PY, "train.py", "--lr", "1"], worker_env, str(tmp_path), env, PY)
    assert why == "" and assignment is not None
    assert (assignment.kind, assignment.target, assignment.args, assignment.cwd) == ("script",
                                                                                     "train.py", ["--lr",
                                                                                                  "1"], str(tmp_path))
    assert assignment.env == worker_env
    module, _ = spare_assignment([PY, "-m", "pkg.train", "x"], env, str(tmp_path), env, PY)
    assert module is not None and (module.kind, module.target, module.args) == ("module", "pkg.train", ["x"])


def test_the_interpreter_named_by_another_link_in_its_folder_is_the_same_python(tmp_path) -> None:
    """An agent run as `.venv/bin/python3`, a job started with `.venv/bin/python train.py`: one
    Python. The same file linked from another folder is another Python (a virtual environment
    and its base interpreter are one file with two `pyvenv.cfg`s apart)."""
    (tmp_path / "train.py").write_text("pass\n")
    bin_dir, other = tmp_path / "venv" / "bin", tmp_path / "other"
    bin_dir.mkdir(parents=True)
    other.mkdir()
    for link in (bin_dir / "python3", bin_dir / "python", other / "python"):
        link.symlink_to(PY)
    env = {"PATH": os.environ["PATH"]}
    fits, why = spare_assignment([str(bin_dir / "python"), "train.py"], env, str(tmp_path), env,
                                 str(bin_dir / "python3"))
    assert fits is not None, why
    unfit, why = spare_assignment([str(other / "python"), "train.py"], env, str(tmp_path), env,
                                  str(bin_dir / "python3"))
    assert unfit is None and "is not this agent's Python" in why


@pytest.mark.parametrize("argv, reason", [
    (["/bin/sh", "train.py"], "is not this agent's Python"),
    ([PY, "-u", "train.py"], "interpreter options"),
    ([PY, "-c", "pass"], "interpreter options"),
    ([PY], "interpreter options"),
    ([PY, "missing.py"], "is not a script file"),
    ([], "no command"),
])
def test_commands_a_spare_cannot_be_start_fresh(tmp_path, argv, reason) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    env = {"PATH": os.environ["PATH"]}
    assignment, why = spare_assignment(argv, env, str(tmp_path), env, PY)
    assert assignment is None and reason in why


def test_an_environment_that_differs_beyond_the_worker_variables_starts_fresh(tmp_path) -> None:
    """PYTHONPATH, CUDA_VISIBLE_DEVICES, MKL_NUM_THREADS... may have shaped the spare's imports.
    OMP_NUM_THREADS, the agent's thread count, is a worker variable: the spare applies it."""
    (tmp_path / "train.py").write_text("pass\n")
    spare_env = {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "0"}
    for worker_env in ({**spare_env, "CUDA_VISIBLE_DEVICES": "1"}, {**spare_env, "PYTHONPATH": "/x"},
                       {**spare_env, "MKL_NUM_THREADS": "1"}, {"PATH": os.environ["PATH"]}):
        assignment, why = spare_assignment([PY, "train.py"], worker_env, str(tmp_path), spare_env, PY)
        assert assignment is None and "differs from the spare's in" in why
    assignment, _ = spare_assignment([PY, "train.py"], {**spare_env, "OMP_NUM_THREADS": "1"}, str(tmp_path), spare_env,
                                     PY)
    assert assignment is not None and assignment.env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("line, problem", [
    (b"not json\n", "Expecting value"),
    (b"[1]\n", "not a JSON object"),
    (b'{"kind": "shell", "target": "x", "args": [], "env": {}, "cwd": "/"}\n', "no script or module"),
    (b'{"kind": "script", "target": "x", "args": [1], "env": {}, "cwd": "/"}\n', "arguments"),
    (b'{"kind": "script", "target": "x", "args": [], "env": {"A": 1}, "cwd": "/"}\n', "environment"),
    (b'{"kind": "script", "target": "x", "args": [], "env": {}, "cwd": "rel"}\n', "working directory"),
    (b"x" * (MAX_ASSIGNMENT_BYTES + 1), "longer than"),
])
def test_a_malformed_assignment_is_refused_naming_what_is_wrong(line, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_assignment(line)


class _Output:
    """Collects the lines of processes, with the prefix each line had when it came."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.threads: list[threading.Thread] = []

    def forward(self, proc: subprocess.Popen, prefix: list[str]) -> None:
        def read(pipe) -> None:
            for raw in iter(pipe.readline, b""):
                self.lines.append(prefix[0] + raw.decode())

        for pipe in (proc.stdout, proc.stderr):
            thread = threading.Thread(target=read, args=(pipe,), daemon=True)
            thread.start()
            self.threads.append(thread)


@pytest.fixture
def pool_of(tmp_path, monkeypatch):
    """Real spare pools over this test's folder; every spare and worker killed at teardown."""
    monkeypatch.chdir(tmp_path)
    made: list[tuple[SparePool, list]] = []

    def make(count: int = 1, env: dict[str, str] | None = None, **kwargs) -> tuple[SparePool, _Output, list]:
        output, said = _Output(), []
        pool = SparePool(count, lambda: dict(env if env is not None else os.environ), output.forward,
                         lambda kind, **fields: said.append((kind, fields)), replace_after_s=0.0, **kwargs)
        made.append((pool, said))
        return pool, output, said

    procs: list[subprocess.Popen] = []
    try:
        yield make
    finally:
        for pool, _ in made:
            procs += [s.proc for s in pool.idle]
            pool.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def warm(pool: SparePool) -> None:
    """Start the pool's spares and wait until each says it has imported what it preloads."""
    pool.hold()
    pool.tend()
    assert len(pool.idle) == pool.count

    def ready() -> bool:
        pool.tend()
        return all(s.ready_s is not None for s in pool.idle)

    wait_for(ready, 60, "the spares to be warm")


@pytest.mark.slow  # (seconds of real interpreters starting: with the end-to-end tests)
def test_a_spare_is_indistinguishable_from_a_fresh_python_for_its_script(pool_of, tmp_path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    pool, output, said = pool_of(1)
    warm(pool)
    env = {**os.environ, "RANK": "1", "RINGMASTER_WORKER_ID": "hostA/2"}
    argv = [PY, "probe.py", "--epochs", "3"]
    proc = pool.take(argv, env, "hostA/2")
    assert proc is not None
    assert proc.wait(60) == 0
    fresh = subprocess.run(argv, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=60)
    wait_for(lambda: not any(t.is_alive() for t in output.threads), 10, "the spare's output")
    ran = [line for line in output.lines if line.startswith("[hostA/2] {")]
    assert len(ran) == 1, output.lines
    as_spare, as_fresh = json.loads(ran[0].removeprefix("[hostA/2] ")), json.loads(fresh.stdout)
    assert as_spare == as_fresh
    assert as_spare["argv"] == ["probe.py", "--epochs", "3"] and as_spare["env"]["RANK"] == "1"
    assert [kind for kind, _ in said] == [Kind.SPARE_READY, Kind.SPARE_USED]
    assert said[-1][1]["pid"] == proc.pid and said[-1][1]["warm"] is True


@pytest.mark.slow  # (seconds of real interpreters starting: with the end-to-end tests)
def test_a_spare_given_a_thread_count_runs_with_it(pool_of, tmp_path) -> None:
    """The spare's OpenMP read an environment without OMP_NUM_THREADS (torch's default: a thread
    a core); the worker it becomes runs with the agent's count, as a fresh process given it would."""
    (tmp_path / "threads.py").write_text("import torch; print('threads', torch.get_num_threads())\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    pool, output, _ = pool_of(1, env=env)
    warm(pool)
    proc = pool.take([PY, "threads.py"], {**env, "OMP_NUM_THREADS": "3"}, "w1")
    assert proc is not None and proc.wait(60) == 0
    wait_for(lambda: not any(t.is_alive() for t in output.threads), 10, "the spare's output")
    assert "[w1] threads 3\n" in output.lines, output.lines


@pytest.mark.slow  # (seconds of real interpreters starting: with the end-to-end tests)
def test_a_spare_runs_a_module_as_python_dash_m_does_and_keeps_its_exit_code(pool_of, tmp_path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text(PROBE)
    env = {**os.environ, "PROBE_EXIT": "7"}
    pool, output, _ = pool_of(1, env=env)  # (a variable of the spare's own environment: it fits)
    warm(pool)
    proc = pool.take([PY, "-m", "pkg.probe", "a"], env, "w1")
    assert proc is not None and proc.wait(60) == 7
    fresh = subprocess.run([PY, "-m", "pkg.probe", "a"], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60)
    assert fresh.returncode == 7
    wait_for(lambda: not any(t.is_alive() for t in output.threads), 10, "the spare's output")
    as_spare = json.loads(next(line for line in output.lines if line.startswith("[w1] {")).removeprefix("[w1] "))
    as_fresh = json.loads(fresh.stdout)
    for key in ("argv", "path0", "cwd", "env", "signals", "stdin", "main_is_this"):
        assert as_spare[key] == as_fresh[key], key
    for key in ("__name__", "__file__", "__package__"):
        assert as_spare["globals"][key] == as_fresh["globals"][key], key


@pytest.mark.slow  # (seconds of real interpreters starting: with the end-to-end tests)
def test_a_used_spare_is_replaced_and_an_unfit_worker_leaves_the_spare_idle(pool_of, tmp_path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    pool, _, said = pool_of(1)
    warm(pool)
    first = pool.idle[0].proc.pid
    assert pool.take(["/bin/true"], dict(os.environ), "w0") is None  # not Python: fresh, the spare stays
    assert [s.proc.pid for s in pool.idle] == [first] and said[-1][0] is Kind.SPARE_UNFIT
    proc = pool.take([PY, "probe.py"], dict(os.environ), "w1")
    assert proc is not None and proc.pid == first and not pool.idle
    pool.tend()
    assert len(pool.idle) == 1 and pool.idle[0].proc.pid != first
    assert proc.wait(60) == 0


@pytest.mark.slow  # (seconds of real interpreters starting: with the end-to-end tests)
def test_a_joining_host_warms_a_spare_per_slot_then_keeps_its_usual_count(pool_of, tmp_path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    pool, _, _ = pool_of(1)
    pool.tend()
    assert not pool.idle  # no worker started yet: a job's first workers start fresh
    pool.warm_for_join(2)
    pool.tend()
    assert len(pool.idle) == 2
    wait_for(lambda: (pool.tend(), pool.warm() == 2)[1], 60, "two warm spares")
    first = pool.take([PY, "probe.py"], dict(os.environ), "w1")
    second = pool.take([PY, "probe.py"], dict(os.environ), "w2")
    assert first is not None and second is not None and not pool.idle
    pool.tend()
    assert len(pool.idle) == 1  # back to --spares once the host's first workers took theirs
    assert first.wait(60) == 0 and second.wait(60) == 0


def _python_over(pid: int, size: int) -> bool:
    """Whether `pid` is this interpreter's program (not yet the setpriv before it) and holds over `size` bytes."""
    try:
        running = os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return False
    return running == os.path.realpath(sys.executable) and rss_bytes(pid) > size


@pytest.mark.slow  # (seconds of real interpreters starting: with the end-to-end tests)
def test_spares_are_stopped_when_retired_or_grown_too_big(pool_of) -> None:
    pool, _, said = pool_of(2, max_rss_bytes=1 << 20)  # 1 MiB: any Python is past it
    pool.hold()
    pool.tend()
    started = [s.proc for s in pool.idle]
    assert len(started) == 2
    # (Python itself past 1 MiB: a spare starts as setpriv, itself over 1 MiB, which then execs a
    # Python whose first pages are under it; the pool would stop that one at a later poll)
    wait_for(lambda: all(_python_over(p.pid, 1 << 20) for p in started), 30, "the spares' Python to be running")
    pool._next_start = float("inf")  # (no replacements: this test looks at the stopping alone)
    pool.tend()
    assert not pool.idle
    # (killed: the pool waits a bounded time for each; on a loaded machine the end may come later)
    wait_for(lambda: all(p.poll() is not None for p in started), 30, "the spares grown too big to end")
    assert [kind for kind, _ in said if kind is not Kind.SPARE_READY] == [Kind.SPARE_TOO_BIG] * 2
    pool, _, _ = pool_of(1)
    warm(pool)
    spare = pool.idle[0].proc
    pool.close()
    assert not pool.idle
    wait_for(lambda: spare.poll() is not None, 30, "the closed pool's spare to end")


def test_spares_that_die_before_use_turn_spares_off_once(pool_of) -> None:
    """PYTHONHOME pointing nowhere: the interpreter cannot even start (as a broken environment)."""
    pool, output, said = pool_of(1, env={**os.environ, "PYTHONHOME": "/nonexistent"})
    pool.hold()
    for _ in range(3):
        pool.tend()
        wait_for(lambda: all(s.proc.poll() is not None for s in pool.idle), 30, "the broken spare to die")
        pool._next_start = 0.0  # (its replacement now, not after replace_after_s)
    pool.tend()
    assert pool.count == 0 and not pool.idle
    assert [kind for kind, _ in said] == [Kind.SPARE_OFF]
    assert "exited with code" in said[0][1]["reason"]


@pytest.mark.slow  # (seconds of real interpreters starting: with the end-to-end tests)
def test_a_spare_whose_agent_closes_its_stdin_exits_without_running_anything(tmp_path) -> None:
    marker = tmp_path / "ran"
    proc = subprocess.Popen([PY, "-m", "ringmaster.worker.agent.starting.spare_process"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(b"", timeout=60)
        assert proc.returncode == 0, err
        proc = subprocess.Popen([PY, "-m", "ringmaster.worker.agent.starting.spare_process"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        out, err = proc.communicate(b'{"kind": "script", "target": "' + str(marker).encode() + b'", "args": []}\n',
                                    timeout=60)
        assert proc.returncode == 3 and b"refused its assignment" in err and not marker.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_spares_wait_for_the_workers_started_fresh_to_use_their_start_ups_cpu_not_only_the_clock(pool_of) -> None:
    """On a loaded machine the first workers' imports outlast any hold in seconds (CI: 4 spares
    importing beside the demo's 4 workers, no step after 60 s). Their CPU time says when their
    start-up is over; a worker that never uses it holds spares back for MAX_FRESH_HOLD_S at most."""
    from ringmaster.worker.agent.starting.spare_pool import MAX_FRESH_HOLD_S, STARTUP_CPU_S

    now, cpu = [0.0], {101: 0.5, 102: 0.5}
    pool, _, _ = pool_of(1, fresh_hold_s=10.0, clock=lambda: now[0], cpu_seconds=cpu.get)
    pool.started_fresh(101)
    pool.started_fresh(102)
    now[0] = 30.0  # the hold in seconds is over, both workers still importing
    pool.tend()
    assert pool.idle == []
    cpu[101] = STARTUP_CPU_S  # one is through its start-up, the other is not
    pool.tend()
    assert pool.idle == []
    del cpu[102]  # the other ended
    pool.tend()
    assert len(pool.idle) == 1  # (a real spare, killed at teardown)

    pool.close()
    now[0], cpu[103] = 100.0, 0.0
    pool.started_fresh(103)  # a worker that waits at its start, using no CPU
    now[0] = 100.0 + MAX_FRESH_HOLD_S - 1
    pool.tend()
    assert pool.idle == []
    now[0] = 100.0 + MAX_FRESH_HOLD_S
    pool.tend()
    assert len(pool.idle) == 1
