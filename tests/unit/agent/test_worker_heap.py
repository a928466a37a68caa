"""A worker's C heap keeps what it frees (`starting/heap.py`): the variables its environment gets,
a user's own choice kept, and real processes (started fresh, and forked from a real template)
that allocate, write and free 64 MB again and again without faulting its pages in each time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from ringmaster.worker.agent.starting.heap import HEAP_ENV, KEEP_FREED, heap_choice_error, heap_settings
from ringmaster.worker.agent.starting.spare_pool import spare_assignment
from ringmaster.worker.agent.starting.template import WorkerTemplate
from ringmaster.worker.agent.starting.threads import SHARED_MACHINE_ENV
from ringmaster.worker.agent.worker_environment import ahead_environment, worker_environment

PY = sys.executable
WAIT_S = 120.0  # (a template imports torch: tens of seconds on a loaded machine)

#: Prints the page faults of five rounds of malloc, memset and free of 64 MB, after one round:
#: over glibc's largest mmap threshold (32 MB), so by default every round maps fresh pages.
ROUNDS = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 64 << 20

def round_():
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)
    libc.free(block)

round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, flush=True)
"""
PAGES = 5 * (64 << 20) // os.sysconf("SC_PAGE_SIZE")  # (what five rounds fault without the setting)


def _without_user_choice(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items()
            if not name.startswith("MALLOC_") and name not in ("GLIBC_TUNABLES", HEAP_ENV)}


def _worker_env(spec_env: dict[str, str], monkeypatch) -> dict[str, str]:
    for name in list(os.environ):
        if name.startswith("MALLOC_") or name in ("GLIBC_TUNABLES", HEAP_ENV):
            monkeypatch.delenv(name)
    return worker_environment(spec_env, "h/0", None, "/tmp/stops", "", None, ["127.0.0.1:1"])


def test_a_worker_gets_the_settings_unless_its_user_chose(monkeypatch) -> None:
    plain = _without_user_choice(dict(os.environ))
    assert heap_settings(plain) == KEEP_FREED
    assert heap_settings({**plain, "MALLOC_ARENA_MAX": "4"}) == {}
    assert heap_settings({**plain, "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) == {}
    assert heap_settings({**plain, "GLIBC_TUNABLES": "glibc.rtld.nns=2"}) == KEEP_FREED
    assert heap_settings({**plain, HEAP_ENV: "System "}) == {}

    env = _worker_env({}, monkeypatch)
    assert {name: env[name] for name in KEEP_FREED} == KEEP_FREED
    chosen = _worker_env({"MALLOC_ARENA_MAX": "8"}, monkeypatch)  # (the job's own variable)
    assert chosen["MALLOC_ARENA_MAX"] == "8" and not set(KEEP_FREED) - {"MALLOC_ARENA_MAX"} & set(chosen)


@pytest.mark.parametrize("spec_env", [{}, {"MALLOC_ARENA_MAX": "8"}])
def test_a_spare_warmed_ahead_of_its_job_fits_its_worker_unless_the_job_chose(spec_env, tmp_path, monkeypatch) -> None:
    """A pool's agent warms spares before it knows its job (`daemon.warm_ahead`): they start with
    the heap's settings as a worker does, so its first workers start in them (found by the pool
    agents' e2e test: every worker started fresh, "differs from the spare's in MALLOC_ARENA_MAX")."""
    (tmp_path / "train.py").write_text("")
    worker = _worker_env(spec_env, monkeypatch)
    assignment, why = spare_assignment([PY, "train.py"], worker, str(tmp_path), ahead_environment())
    if spec_env:  # (the job's own choice is the worker's: a spare started without it cannot be it)
        assert assignment is None and "MALLOC_ARENA_MAX" in why
    else:
        assert assignment is not None, why


def test_a_spare_warmed_ahead_fits_its_worker_on_an_agent_told_it_shares_the_machine(tmp_path, monkeypatch) -> None:
    """The agent's own hint that it shares the machine is its to read: taken out of a worker's
    environment and, by the same rule, a spare's warmed ahead (which kept it: a mismatch)."""
    (tmp_path / "train.py").write_text("")
    monkeypatch.setenv(SHARED_MACHINE_ENV, "1")
    worker = _worker_env({}, monkeypatch)
    ahead = ahead_environment()
    assert SHARED_MACHINE_ENV not in worker and SHARED_MACHINE_ENV not in ahead
    assignment, why = spare_assignment([PY, "train.py"], worker, str(tmp_path), ahead)
    assert assignment is not None, why


@pytest.mark.parametrize("value", ["", " ", "system", "System "])
def test_a_heap_choice_is_system_or_unset(value) -> None:
    assert heap_choice_error({HEAP_ENV: value}) is None
    assert heap_choice_error({}) is None


@pytest.mark.parametrize("value", ["sytem", "glibc", "off"])
def test_a_heap_choice_that_is_not_one_is_named(value) -> None:
    """A typo would keep the settings on in silence: refused, naming the variable and the choice."""
    problem = heap_choice_error({HEAP_ENV: value})
    assert problem is not None and f"{HEAP_ENV}={value!r}" in problem and "system" in problem


@pytest.mark.parametrize("command", [["run", "-np", "1", "python", "-c", "pass"],
                                     ["agent", "--rendezvous", "127.0.0.1:1", "--host", "h"]])
def test_ringmaster_refuses_a_heap_choice_that_is_not_one(command, tmp_path) -> None:
    """`ringmaster run` and `ringmaster agent` refuse before they start anything."""
    env = {**os.environ, HEAP_ENV: "sytem", "RINGMASTER_SECRET": "x" * 32}
    done = subprocess.run([PY, "-m", "ringmaster.cli", *command], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=WAIT_S, start_new_session=True)
    assert done.returncode != 0 and f"{HEAP_ENV}='sytem'" in done.stderr, done.stderr


@pytest.mark.parametrize("keeps", [True, False])
def test_a_fresh_worker_reuses_the_memory_it_freed(keeps, tmp_path, monkeypatch) -> None:
    env = _worker_env({} if keeps else {HEAP_ENV: "system"}, monkeypatch)
    done = subprocess.run([PY, "-c", ROUNDS], env=env, capture_output=True, text=True, timeout=WAIT_S,
                          start_new_session=True)
    assert done.returncode == 0, done.stderr
    faults = int(done.stdout)
    if keeps:
        assert faults < PAGES // 20, faults
    else:  # (glibc's defaults, as the variables are absent: what the setting changes)
        assert faults > PAGES * 9 // 10, faults


@pytest.mark.slow  # (a template's imports: with the end-to-end tests)
def test_a_worker_forked_from_the_template_reuses_the_memory_it_freed(tmp_path, monkeypatch) -> None:
    """The template is started with the worker's variables, so its forks have the setting too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rounds.py").write_text(ROUNDS)
    env = _worker_env({}, monkeypatch)
    template = WorkerTemplate(env, lambda kind, **fields: None)
    try:
        assert template.ready(WAIT_S)
        proc, why = template.fork([PY, "rounds.py"], env, "h/0")
        assert proc is not None, why
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
        reader.start()
        assert proc.wait(WAIT_S) == 0
        reader.join(WAIT_S)
        assert int(out[0]) < PAGES // 20, out
    finally:
        template.close()
