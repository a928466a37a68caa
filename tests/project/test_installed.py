"""Ringmaster as users install it, away from this checkout: the wheel and the sdist that
`python -m build` makes from a clean copy, each installed by `deploy/install.sh` (what the image
runs) into a fresh virtual environment, then every verb's `--help`, a 2-worker elastic job and a
pool with one submitted job, all through the installed `ringmaster`; and the documentation site
built strictly in the wheel's venv, made with the `docs` extra and nothing else (no test extra,
no Ray), so a warning or a dependency the docs lack fails it.

No Docker daemon runs on the machines the tests run on, so the image itself is not built here:
the test runs the same `deploy/install.sh` the Dockerfile runs.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import subprocess
import sys
import tarfile
import venv
import zipfile

import pytest
from harness import ROOT, WORKLOADS, copy_checkout, read_logs
from pool_rig import Pool
from test_docs import _hook

# One xdist worker builds both and runs every check (the builds and the venvs are made once).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("installed")]



@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A clean copy of the checkout (.git too: the version's source)."""
    return copy_checkout(tmp_path_factory.mktemp("source") / "ringmaster")


@pytest.fixture(scope="module")
def built(source: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """The sdist, and the wheel built from that sdist (as `python -m build` does): a file the
    sdist leaves out fails the wheel's build or its checks."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("ringmaster-*.whl")
    (sdist,) = out.glob("ringmaster-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def _installed(tmp_path_factory: pytest.TempPathFactory, what: str) -> pathlib.Path:
    """A fresh venv (no system packages) with `what` installed by deploy/install.sh."""
    home = tmp_path_factory.mktemp("venv")
    venv.create(home, with_pip=True)
    done = subprocess.run(["sh", str(ROOT / "deploy" / "install.sh"), what], cwd=home, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHON": str(home / "bin" / "python")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return home


@pytest.fixture(scope="module")
def wheel_venv(built, tmp_path_factory) -> pathlib.Path:
    return _installed(tmp_path_factory, f"{built['wheel']}[docs]")


@pytest.fixture(scope="module")
def sdist_venv(built, tmp_path_factory) -> pathlib.Path:
    return _installed(tmp_path_factory, str(built["sdist"]))


def _env(home: pathlib.Path) -> dict[str, str | None]:
    """The installed venv first on PATH (the training command's `python` is its python), nothing
    of this checkout on PYTHONPATH."""
    return {"PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": None, "VIRTUAL_ENV": str(home)}


def _verbs() -> list[list[str]]:
    return [verb.split()[1:] for verb, _ in _hook()._verbs()]


def test_the_sdist_carries_the_source_and_the_wheel_the_packages(built) -> None:
    with tarfile.open(built["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for needed in ("pyproject.toml", "README.md", "proto/ringmaster.proto", "worker/torch/__init__.py",
                   "rendezvous/pool/service.py", "PKG-INFO"):
        assert needed in names, needed
    wheel = zipfile.ZipFile(built["wheel"]).namelist()
    assert "ringmaster/_version.py" in wheel and "ringmaster/rendezvous/pool/service.py" in wheel


def _help(home: pathlib.Path, verb: list[str], cwd: pathlib.Path) -> str:
    env = {k: v for k, v in {**os.environ, **_env(home)}.items() if v is not None}
    done = subprocess.run([str(home / "bin" / "ringmaster"), *verb, "--help"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    return "" if done.returncode == 0 and done.stdout.startswith("usage: ringmaster") else \
        f"`ringmaster {' '.join(verb)} --help` exited {done.returncode}: {done.stderr[-600:]}"


@pytest.mark.parametrize("which", ["wheel", "sdist"])
def test_every_verb_a_job_and_a_pool_job_run_from_the_installed_package(which, request, run_job, source: pathlib.Path,
                                                                         tmp_path: pathlib.Path) -> None:
    home: pathlib.Path = request.getfixturevalue(f"{which}_venv")
    program = [str(home / "bin" / "ringmaster")]
    version = subprocess.run([*program, "--version"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    from setuptools_scm import get_version

    # The version of the source it was built from (not this checkout's install, which says the
    # version it was installed at and goes stale with the next commit).
    assert version.stdout.strip() == f"ringmaster {get_version(root=str(source))}", version.stdout
    verbs = _verbs()
    assert ["pool", "serve"] in verbs and ["submit"] in verbs and len(verbs) >= 15
    with concurrent.futures.ThreadPoolExecutor(4) as helps:
        problems = [p for p in helps.map(lambda verb: _help(home, verb, tmp_path), verbs) if p]
    assert not problems, problems

    log = tmp_path / "log"
    log.mkdir()
    training = ["python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(log), "--epochs", "2", "--samples", "64",
                "--step-time", "0.02"]
    job = run_job("-np", "2", "--min-np", "1", "--start-timeout", "60", *training, program=program, cwd=tmp_path,
                  env=_env(home))
    assert job.wait(300) == 0, job.output[-4000:]
    where = [r["ringmaster"] for records in read_logs(log).values() for r in records if r["event"] == "done"]
    assert len(where) >= 1 and all(pathlib.Path(w).is_relative_to(home) for w in where), where

    pool = Pool(run_job, tmp_path, "-H", "hA:2", program=program, cwd=tmp_path, env=_env(home))
    pool_log = tmp_path / "pool-log"
    pool_log.mkdir()
    pool_training = [part if part != str(log) else str(pool_log) for part in training]
    submitted = run_job("--pool", pool.url, "--name", "installed", "-np", "2", *pool_training, verb="submit",
                        program=program, cwd=tmp_path, env=_env(home))
    assert submitted.wait(60) == 0, submitted.output[-3000:]
    (row,) = pool.call("/jobs")
    pool.wait_job(row["id"], lambda j: j["state"] == "succeeded", 300, "the pool's job to succeed")
    assert sum(1 for records in read_logs(pool_log).values() for r in records if r["event"] == "commit") > 0


def test_the_docs_build_strictly_with_the_docs_extra_alone(wheel_venv: pathlib.Path, source: pathlib.Path,
                                                          tmp_path: pathlib.Path) -> None:
    """mkdocs from the venv made of the wheel and its `docs` extra (no Ray, no test extra), run
    as its own command (not `python -m`, which would put this checkout's folder on sys.path),
    without --quiet: --strict fails on any warning."""
    site = tmp_path / "site"
    env = {k: v for k, v in {**os.environ, **_env(wheel_venv), "NO_MKDOCS_2_WARNING": "1"}.items() if v is not None}
    assert subprocess.run([str(wheel_venv / "bin" / "python"), "-c", "import ray"], env=env,
                          capture_output=True, timeout=60).returncode != 0, "the docs venv has Ray: not docs alone"
    done = subprocess.run([str(wheel_venv / "bin" / "mkdocs"), "build", "--strict", "--site-dir", str(site)],
                          cwd=source, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (site / "reference" / "cli" / "index.html").read_text().count("--network-interfaces") >= 1
