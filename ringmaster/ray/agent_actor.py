"""The agent of one Ray node: a Ray actor pinned to the node that runs a Ringmaster agent there.

The actor reserves the node's worker slots (CPUs, and GPUs, which Ray then makes the only ones
its processes see), writes the training call it was given into a private folder on the node, and
starts the agent as its child with the host's key on its stdin, as every launcher does. The agent
starts the workers as on any host, so a failure is recovered at Ringmaster's speed, not Ray's.

The agent dies with the actor (its death signal): a node that dies, or an actor that is killed,
is a lost host. `drain` sends the agent SIGTERM, which drains its host (workers leave at their
next commit); `stop` closes its stdin, which stops it at once.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Mapping

from ringmaster.common.secret import SECRET_ENV
from ringmaster.ray.call import CALL_ENV, CALL_FILE, MAX_RESULT_BYTES, RESULTS_ENV, result_files

#: Lines of the agent's output kept to say why it ended.
KEPT_LINES = 5


class AgentProcess:
    """What the actor does (plain Python: `ray.remote` makes the actor of it, `launcher` says how)."""

    def __init__(self, argv: list[str], handover_line: bytes, environment: Mapping[str, str], call: bytes,
                 cwd: str | None) -> None:
        from ringmaster.common.processes import dying_with_parent

        self.folder = tempfile.mkdtemp(prefix="ringmaster-ray-")  # 0700: the call and results are the job's
        call_path = os.path.join(self.folder, CALL_FILE)
        with open(call_path, "wb") as file:
            file.write(call)
        self.results_folder = os.path.join(self.folder, "results")
        os.mkdir(self.results_folder, 0o700)
        env = {**os.environ, **environment, CALL_ENV: call_path, RESULTS_ENV: self.results_folder}
        env.pop(SECRET_ENV, None)  # a job secret in Ray's environment is not the agent's to hold
        argv = [sys.executable, *argv[1:]]  # this node's Python, not the driver's path to it
        self.output: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        # Started from the actor's main thread: the death signal follows the thread that started it.
        self.proc = subprocess.Popen(dying_with_parent(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env,
                                     cwd=cwd if cwd and os.path.isdir(cwd) else None, start_new_session=True)
        self._relay = threading.Thread(target=self._copy_output, daemon=True)
        self._relay.start()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(handover_line)
            self.proc.stdin.flush()
        except OSError:
            pass  # it is gone already: `wait` says how

    def _copy_output(self) -> None:
        """The agent's (and its workers') lines go to the actor's output, which Ray shows on the
        driver; the last are kept to say why it ended."""
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            self.output.append(line[:500])
            print(line, flush=True)

    def wait(self) -> tuple[int, list[str]]:
        """Returns when the agent has ended: its exit code and last lines."""
        code = self.proc.wait()
        self._relay.join(2.0)
        return code, list(self.output)

    def drain(self) -> None:
        """Ray drains this node: the agent drains its host (SIGTERM)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """Stop the agent at once (its stdin closes)."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def kill(self) -> None:
        """Kill the agent and its workers (what is left after a stop that took too long)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def results(self) -> dict[int, bytes]:
        """rank -> what the worker of that rank returned (serialized), for each that finished here."""
        return result_files(self.results_folder, MAX_RESULT_BYTES)

    def release(self) -> None:
        """Remove the node's folder (the job is over and its results were read)."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
