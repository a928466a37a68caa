"""A worker under an agent outlives a SIGTERM meant for its whole host, and dies of one its
agent marked, or of a second one (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from harness import ROOT

PROGRAM = """
import os, signal, sys
from ringmaster.worker.train.host_signals import shield_from_host_signals
assert shield_from_host_signals()
print("ready", flush=True)
sys.stdin.readline()
os.kill(os.getpid(), signal.SIGTERM)      # the whole host's SIGTERM: it trains on
print("alive", flush=True)
sys.stdin.readline()
if sys.argv[1] == "marked":
    open(os.path.join(os.environ["RINGMASTER_AGENT_STOPS"], str(os.getpid())), "x").close()
os.kill(os.getpid(), signal.SIGTERM)      # the agent's own (marked), or a second one: ends it here
print("survived", flush=True)
"""


def run(tmp_path, how: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RINGMASTER_AGENT_STOPS": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, how], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate("\n\n", timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_an_unmarked_sigterm_is_survived_and_a_marked_one_ends_the_worker(tmp_path) -> None:
    done = run(tmp_path, "marked")
    assert done.stdout.split() == ["ready", "alive"], done
    assert "came to this whole host" in done.stderr
    assert done.returncode == -signal.SIGTERM


def test_a_second_sigterm_ends_the_worker(tmp_path) -> None:
    done = run(tmp_path, "again")
    assert done.stdout.split() == ["ready", "alive"] and done.returncode == -signal.SIGTERM, done


def test_outside_an_agent_nothing_is_installed() -> None:
    from ringmaster.worker.train.host_signals import shield_from_host_signals

    assert shield_from_host_signals({}) is False
