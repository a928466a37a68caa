"""The worker template where forking can go wrong: a host without pidfds, CUDA in the template,
a request answered too late, a request too big for the socket, a signal in the fork's window,
and a forked worker's own threads, title, collector and `-m` module, each as a fresh worker has
them. Real templates, real forks; the CUDA case alone is decided on stand-in modules, since no
GPU is here to initialize."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import types

import pytest
import seccomp
from harness import ROOT, wait_for
from test_template import PY, WAIT_S, _state, output_of, template_of  # noqa: F401 (template_of: a fixture)

from ringmaster.common.events import Kind
from ringmaster.worker.agent.starting.template_process import MAX_REQUEST_BYTES, fork_hazard

pytestmark = pytest.mark.slow  # (templates import torch: with the end-to-end tests)

SLEEPS = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


@pytest.mark.skipif(not seccomp.supported(), reason="seccomp filters are built for x86_64 and aarch64 here")
def test_a_host_without_pidfds_starts_its_workers_fresh_and_says_why(tmp_path) -> None:
    """pidfd_open refused for real (a seccomp filter, as container runtimes install): the
    template, through which the agent could neither signal nor wait for a forked worker, is
    not started, said once with the reason, and every worker is started fresh."""
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        import seccomp
        seccomp.refuse("pidfd_open", "pidfd_send_signal")
        from ringmaster.worker.agent.starting.template import WorkerTemplate
        said = []
        template = WorkerTemplate(dict(os.environ), lambda kind, **fields: said.append((kind.value, fields)))
        proc, why = template.fork([sys.executable, "x.py"], dict(os.environ), "h/0")
        print(repr((said, proc, why, template.usable, getattr(template, "proc", None))))
        template.close()
    """)
    done = subprocess.run([PY, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    said, proc, why, usable, started = eval(done.stdout)  # (a repr of plain values, printed above)
    assert [kind for kind, _ in said] == ["template.off"] and "pidfd" in said[0][1]["reason"], said
    assert proc is None and "pidfd" in why and not usable and started is None


def test_forking_is_refused_once_the_template_touched_cuda() -> None:
    """Decided on stand-in modules: no GPU here to initialize CUDA (the GPU tests, on a lent
    GPU machine, fork real workers that use CUDA)."""
    def torch_with(initialized: bool, bad_fork: bool = False) -> dict:
        cuda = types.SimpleNamespace(is_initialized=lambda: initialized, _is_in_bad_fork=lambda: bad_fork)
        return {"torch": types.SimpleNamespace(cuda=cuda)}

    assert fork_hazard({}) is None and fork_hazard(torch_with(False)) is None
    assert "CUDA was initialized" in (fork_hazard(torch_with(True)) or "")
    assert "forked from a process that initialized CUDA" in (fork_hazard(torch_with(False, bad_fork=True)) or "")
    assert fork_hazard({"torch": types.SimpleNamespace()}) is None  # (a torch without cuda)
    import torch

    assert fork_hazard() is None and not torch.cuda.is_initialized()  # this process, as the template's


def test_a_worker_forked_after_the_agent_gave_up_on_it_is_killed(template_of, tmp_path) -> None:
    """The template is stopped (SIGSTOP) so that the request times out and the worker is started
    fresh; let go, the template forks it after all: that second process of one worker is killed
    at once and said, and the template is not used again."""
    (tmp_path / "sleeps.py").write_text(SLEEPS)
    template, said = template_of()
    template.fork_timeout_s = 1.0
    assert template.ready(WAIT_S), said
    os.kill(template.proc.pid, signal.SIGSTOP)
    try:
        proc, why = template.fork([PY, "sleeps.py"], dict(os.environ), "h/0")
    finally:
        os.kill(template.proc.pid, signal.SIGCONT)
    assert proc is None and "did not fork a worker within 1 s" in why and not template.usable
    late = wait_for(lambda: [f for k, f in said if k is Kind.TEMPLATE_LATE_FORK], WAIT_S, "the late fork said")
    (fields,) = late
    assert fields["worker"] == "h/0"
    wait_for(lambda: _state(fields["pid"]) in "ZX", WAIT_S, "the late copy killed")


def test_a_request_too_big_for_the_socket_starts_that_worker_fresh_and_keeps_the_template(template_of,
                                                                                        tmp_path) -> None:
    limit = int(open("/proc/sys/net/core/wmem_default").read())
    if limit + (16 << 10) >= MAX_REQUEST_BYTES - 1024:
        pytest.skip(f"this kernel's socket buffer ({limit} bytes) takes any request under the template's limit")
    (tmp_path / "hello.py").write_text("import sys\nprint('hello', len(sys.argv))\n")
    size = limit + (16 << 10)  # over the socket's buffer, under the template's own request limit
    long_args = ["x" * (size // 2), "y" * (size // 2)]  # (one argument may hold 128 KB at most)
    template, said = template_of()
    assert template.ready(WAIT_S), said
    proc, why = template.fork([PY, "hello.py", *long_args], dict(os.environ), "h/0")
    assert proc is None and "do not fit the template's socket" in why, why
    assert template.usable  # that worker alone starts fresh; the next is forked
    forked, why = template.fork([PY, "hello.py"], dict(os.environ), "h/1")
    assert forked is not None, why
    assert output_of(forked)[0] == "hello 1\n" and forked.returncode == 0


def test_a_forked_worker_has_its_threads_title_collector_and_signals_as_its_own(template_of, tmp_path) -> None:
    """Its thread count reaches its BLAS too (read when the template imported numpy), `ps` and
    /proc show its own command (pgrep -f train.py finds it), the template's imports are frozen
    out of its collector, and SIGTERMs sent the moment it exists all end it (a signal in the
    window between the fork and its handlers' return stays pending, never ignored)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: every thread count is already 1")
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import gc, json, os, torch
        from threadpoolctl import threadpool_info
        blas = sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
        print(json.dumps({"blas": blas, "torch": torch.get_num_threads(), "frozen": gc.get_freeze_count(),
                          "cmdline": open(f"/proc/{os.getpid()}/cmdline", "rb").read().decode(errors="replace"),
                          "argv": [os.fsencode(a).hex() for a in __import__("sys").argv[1:]]}))
    """))
    template, said = template_of({k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    assert template.ready(WAIT_S), said
    env = {**template.env, "OMP_NUM_THREADS": "1"}
    proc, why = template.fork([PY, "train.py", "--lr", "0.1", "caf\udce9"], env, "h/0")  # (an argument not UTF-8)
    assert proc is not None, why
    out, err = output_of(proc)
    assert proc.returncode == 0, err
    import json

    seen = json.loads(out)
    assert seen["blas"] == [1] and seen["torch"] == 1, seen
    assert "train.py --lr 0.1 caf\ufffd" in seen["cmdline"].replace("\x00", " ") and "template" not in seen["cmdline"]
    assert seen["argv"] == [b"--lr".hex(), b"0.1".hex(), b"caf\xe9".hex()], seen  # (its argv keeps the bytes)
    assert seen["frozen"] > 10_000, seen  # (torch's objects: hundreds of thousands)

    (tmp_path / "sleeps.py").write_text(SLEEPS)
    procs = []
    for n in range(12):
        forked, why = template.fork([PY, "sleeps.py"], dict(template.env), f"h/{n + 1}")
        assert forked is not None, why
        forked.send_signal(signal.SIGTERM)  # (at once: maybe before it has its handlers back)
        procs.append(forked)
    assert [p.wait(WAIT_S) for p in procs] == [-signal.SIGTERM] * len(procs)


def test_a_module_worker_is_finalized_as_its_own_main(template_of, tmp_path) -> None:
    """`python -m module` keeps the module as `__main__` to the end, so its objects are finalized
    at exit (a `__del__` that flushes a file runs) even when it leaves by sys.exit; a forked
    worker finalized the template's own `__main__` instead."""
    (tmp_path / "leaves.py").write_text(textwrap.dedent("""
        import sys
        import ringmaster.torch  # (a Ringmaster script: its exit handler finalizes the script)

        class Flushes:
            def __del__(self):
                with open("finalized", "w") as f:
                    f.write(__name__)

        kept = Flushes()
        sys.exit(0)
    """))
    fresh = subprocess.run([PY, "-m", "leaves"], cwd=tmp_path, capture_output=True, text=True, timeout=WAIT_S)
    assert fresh.returncode == 0 and (tmp_path / "finalized").read_text() == "__main__", fresh.stderr
    (tmp_path / "finalized").unlink()
    template, said = template_of()
    assert template.ready(WAIT_S), said
    proc, why = template.fork([PY, "-m", "leaves"], dict(os.environ), "h/0")
    assert proc is not None, why
    out, err = output_of(proc)
    assert proc.returncode == 0, err
    assert (tmp_path / "finalized").read_text() == "__main__", err


def test_the_probe_child_finds_a_clean_fork_here() -> None:
    """As the template probes: torch imported (here, not by another test that ran in this
    process before: run alone, the test found torch missing), CUDA never initialized."""
    import torch

    from ringmaster.worker.agent.starting.template_process import probe_fork

    assert not torch.cuda.is_initialized()
    assert probe_fork() is None


def test_the_template_warms_up_without_a_full_collection() -> None:
    """A full collection after torch's imports found some ten objects to free and took 0.12-0.15 s
    of an idle core on the path of a new host's first worker: the template freezes its heap for
    its forks without one."""
    import gc

    import torch  # noqa: F401 (what the template has imported when it warms up)

    from ringmaster.worker.agent.starting.template_process import warm_up

    full: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(seen)
    try:
        assert warm_up() is None
        assert gc.get_freeze_count() > 10_000  # (torch's objects, out of the collector's sight)
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
    assert full == []
