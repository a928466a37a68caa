"""A warm spare: a worker process started before it is needed.

It imports what every worker imports and that takes seconds (`PRELOADED`: torch, the
Ringmaster library), then waits, running nothing else, for one assignment on stdin: the
training command, its environment and working directory (one JSON line from its agent). It
then becomes that worker as a fresh interpreter would: stdin from /dev/null, the working
directory and environment replaced, `sys.argv` and `sys.path[0]` set as `python script.py` or
`python -m module` sets them, and the program run as `__main__` (a fresh module, as the
interpreter makes it; a module's run by runpy as `python -m` itself runs it, in that module,
which stays `__main__` to the end, so that the exit's finalization reaches the script's objects). End of stdin before an
assignment (the agent retired it, or died) ends the spare.

Run as `python -m ringmaster.worker.agent.starting.spare_process` by the agent (see `spare_pool.py`), never by hand.
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import runpy
import sys
import types
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader

from ringmaster.worker.agent.starting.threads import THREADS_ENV, applicable_threads

#: Modules imported ahead of need (the interpreter-level heavy ones; never the user's).
#: torch._dynamo is imported by the first optimizer a script makes (about 1.3 s here).
PRELOADED = ("torch", "torch.distributed", "torch._dynamo", "ringmaster.torch")
#: Most bytes an assignment may have (a command line and an environment).
MAX_ASSIGNMENT_BYTES = 1 << 20
#: Exit code of a spare that could not import `PRELOADED` or got a malformed assignment.
SPARE_FAILED = 3
#: The descriptor on which a spare says it is warm (one byte, then closed); from its agent.
READY_FD_ENV = "RINGMASTER_SPARE_READY_FD"


@dataclass(frozen=True)
class Assignment:
    """What a spare becomes: `kind` is "script" (target: its path) or "module" (target: its name)."""

    kind: str
    target: str
    args: list[str]
    env: dict[str, str]
    cwd: str

    def to_line(self) -> bytes:
        return json.dumps({"kind": self.kind, "target": self.target, "args": self.args, "env": self.env,
                           "cwd": self.cwd}).encode() + b"\n"


def parse_assignment(line: bytes) -> Assignment:
    """The assignment in `line`; ValueError naming what is wrong otherwise."""
    if len(line) > MAX_ASSIGNMENT_BYTES:
        raise ValueError(f"the assignment is longer than {MAX_ASSIGNMENT_BYTES} bytes")
    raw = json.loads(line)
    if not isinstance(raw, dict):
        raise ValueError("the assignment is not a JSON object")
    kind, target, args, env, cwd = (raw.get(k) for k in ("kind", "target", "args", "env", "cwd"))
    if kind not in ("script", "module") or not isinstance(target, str) or not target:
        raise ValueError("the assignment names no script or module")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError("the assignment's arguments are not a list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the assignment's environment is not a map of strings")
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        raise ValueError("the assignment's working directory is not an absolute path")
    return Assignment(kind, target, args, env, cwd)


def become(assignment: Assignment) -> None:
    """Turn this process into the assigned worker and run it (returns when the program does)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # nothing more comes from the agent; the worker reads no commands from stdin
    os.close(null)
    os.chdir(assignment.cwd)
    os.environ.clear()
    os.environ.update(assignment.env)  # (putenv too: C libraries see the worker's environment)
    threads = applicable_threads(assignment.env.get(THREADS_ENV))
    if threads is not None:
        apply_threads(threads)
    if assignment.kind == "script":
        sys.argv = [assignment.target, *assignment.args]
        sys.path[0] = os.path.dirname(os.path.realpath(assignment.target))  # as `python script.py`
        run_script(assignment.target)
    else:
        sys.argv = [assignment.target, *assignment.args]  # runpy puts the module's file in argv[0]
        sys.path[0] = os.getcwd()  # as `python -m module`
        sys.modules["__main__"] = types.ModuleType("__main__")  # a fresh one, not this process' own
        # runpy's own entry for `python -m` (a private name, the one the interpreter calls): the module
        # runs in `__main__` and stays there, and a module that cannot be found exits as `python -m` does.
        runpy._run_module_as_main(assignment.target, alter_argv=True)  # type: ignore[attr-defined]


def apply_threads(threads: int) -> None:
    """Give this process `threads` threads, where its libraries read their count when they were
    loaded (in the spare or template, with its environment): torch's own pool, and the BLAS and
    OpenMP pools of what is loaded (numpy's OpenBLAS, MKL), through threadpoolctl."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    if "numpy" in sys.modules or "torch" in sys.modules:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)  # (kept: called as a function, not as a context)


def run_script(target: str) -> None:
    """Run the file `target` as `python target` runs it: in a fresh `__main__` module with the
    attributes the interpreter gives one (an absolute `__file__`, a source loader, no package or
    spec). runpy.run_path differs (a relative `__file__`, no loader, `__package__` "")."""
    path = os.path.abspath(target)
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path),
                                __package__=None, __spec__=None, __annotations__={}, __builtins__=builtins)
    sys.modules["__main__"] = main_module
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main_module.__dict__)


def preload(who: str) -> bool:
    """Import `PRELOADED`; False, said on stderr as `who`, where one cannot be (no torch here:
    the agent starts its workers fresh)."""
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except Exception as exc:
            print(f"{who}: cannot import {name}: {exc}", file=sys.stderr)
            return False
    return True


def main() -> int:
    if not preload("warm spare"):
        return SPARE_FAILED
    ready_fd = os.environ.pop(READY_FD_ENV, None)
    if ready_fd is not None and ready_fd.isdigit():
        try:
            os.write(int(ready_fd), b"1")
            os.close(int(ready_fd))
        except OSError:
            pass  # the agent stopped listening: it can still assign this spare
    line = sys.stdin.buffer.readline(MAX_ASSIGNMENT_BYTES + 1)
    if not line:
        return 0  # retired before any assignment
    try:
        assignment = parse_assignment(line)
    except ValueError as exc:
        print(f"warm spare: refused its assignment: {exc}", file=sys.stderr)
        return SPARE_FAILED
    become(assignment)
    return 0


if __name__ == "__main__":
    code = main()
    if code:  # the worker's own exit (sys.exit, an exception) never comes here: it leaves through become()
        sys.exit(code)
