"""Run a user's script (a discovery script, a preemption notice script) as an untrusted
command: in its own process group, with its output bounded in bytes and its run in seconds, and
whatever it left running killed. Generic: discovery and the agent's notices both use it."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time


def failure_detail(command: str, returncode: int, stderr: bytes) -> str:
    """What a script that failed said last (its stderr's tail), and chmod +x where it may not run."""
    tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
    detail = f": {' | '.join(line[:200] for line in tail)}" if tail else ""
    if returncode == 126:  # the shell found it but may not run it
        detail += f" (is it executable? chmod +x {command.split()[0] if command.split() else ''})"
    return detail


def run_bounded(command: str, timeout_s: float, max_bytes: int | None = None,
                env: dict[str, str] | None = None) -> tuple[str, int | None, bytes, bytes]:
    """Run a user's script (any shell command line) in its own process group, read at most
    `max_bytes` of its output for at most `timeout_s`, and kill whatever it left running.
    Returns (outcome, exit code, stdout, stderr); outcome is "done", "timeout" or "too-much".
    `OSError` if it cannot be started."""
    proc = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            # so a timeout kills its children too
                            stderr=subprocess.PIPE, start_new_session=True, env=env)
    try:
        outcome, stdout, stderr = _read_bounded(proc, timeout_s, max_bytes or MAX_OUTPUT_BYTES)
    finally:
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
        # Whatever the script left running in its group (`cmd &`) goes with it: scripts run
        # every few seconds, and each run's leftovers would pile up.
        _kill_group(proc.pid)
    proc.wait()
    return outcome, proc.returncode if outcome == "done" else None, stdout, stderr


#: Most bytes of output read from a discovery script (8192 hosts of names up to 500 characters fit).
MAX_OUTPUT_BYTES = 1 << 22
#: Seconds to keep reading after the script exited, for output still in the pipe; a child it
#: left running with the pipe open is not waited for.
_DRAIN_S = 0.2


def _read_bounded(proc: subprocess.Popen, timeout_s: float, max_bytes: int) -> tuple[str, bytes, bytes]:
    """Read the script's stdout and stderr until both close, or until shortly after the script
    itself exited (its children may hold the pipes), or the deadline. Returns ("done" |
    "timeout" | "too-much", stdout, stderr); "done" means `proc` has exited."""
    deadline = time.monotonic() + timeout_s
    out, err = bytearray(), bytearray()
    assert proc.stdout is not None and proc.stderr is not None
    sinks: dict = {proc.stdout: out, proc.stderr: err}
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        for pipe in sinks:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at >= _DRAIN_S:
                break
            if now >= deadline:
                return "timeout", bytes(out), bytes(err)
            wait = min(deadline - now, 0.05)
            for key, _ in selector.select(wait):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                sink = sinks[key.fileobj]
                sink += chunk
                if len(out) > max_bytes:
                    return "too-much", bytes(out), bytes(err)
                if len(err) > max_bytes:
                    del err[: len(err) - max_bytes]  # only its tail is reported
    remaining = deadline - time.monotonic()
    try:
        proc.wait(timeout=max(remaining, 0.0))
    except subprocess.TimeoutExpired:
        return "timeout", bytes(out), bytes(err)
    return "done", bytes(out), bytes(err)


def _kill_group(pid: int) -> None:
    """Kill the script and everything it started (it leads its own process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
