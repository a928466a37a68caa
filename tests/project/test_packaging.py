"""The built wheel installs one namespace, `ringmaster`, and works on its own: nothing generic
(`proto`, `worker`, ...) at the top of site-packages, the user API at `ringmaster.torch`."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import zipfile

import pytest
from harness import ROOT, copy_checkout

# Both tests on one pytest-xdist worker, so the wheel (4-5 s of pip) is built once. Marked slow:
# building, installing and importing it is 10-17 s of the fast suite's 90; the whole suite (CI) runs them.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves a build/ folder in the tree it builds.
    source = tmp_path_factory.mktemp("source") / "ringmaster"
    copy_checkout(source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(source), "-w", str(out)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("ringmaster-*.whl")
    return built


def test_the_wheel_holds_only_the_ringmaster_namespace(wheel: pathlib.Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"ringmaster"}
    assert "ringmaster/torch/__init__.py" in names
    assert "ringmaster/torch/elastic/state.py" in names
    assert "ringmaster/proto/ringmaster.proto" in names
    assert "ringmaster/examples/digits.py" in names  # (what `ringmaster demo` runs, outside a checkout too)
    for page in ("index.html", "dashboard.js", "dashboard.css"):  # the dashboards ship whole
        assert f"ringmaster/rendezvous/server/dashboard/{page}" in names
    assert "ringmaster/rendezvous/pool/service.py" in names  # (`pool serve`, `submit`: once left out)
    assert [n for n in names if n.startswith("ringmaster/rendezvous/pool/dashboard/")]
    assert not [name for name in names if name.endswith(".png")], "README's picture is not part of the package"
    assert not [name for name in names if name.startswith("ringmaster/worker/torch/")], "the user API has one name"


def test_the_installed_wheel_imports_without_the_repository(wheel: pathlib.Path, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    probe = ("import ringmaster.torch as hvd, ringmaster.rendezvous.server.app, ringmaster.cli.main, "
             "ringmaster.proto.ringmaster_pb2_grpc;import ringmaster.rendezvous.pool.service, "
             "ringmaster.rendezvous.scheduling.sizing, ringmaster.worker.agent.pool_agent;print(hvd.__file__); "
             "print(callable(hvd.elastic.run))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(target)})
    assert proc.returncode == 0, proc.stderr
    where, runnable = proc.stdout.split()
    assert pathlib.Path(where).is_relative_to(target), where
    assert runnable == "True"
    wrong = subprocess.run([sys.executable, "-c", "import ringmaster.worker.torch"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(target)})
    assert wrong.returncode != 0


PACKAGE_DIRS_TO_SCAN = ("ringmaster", "proto", "rendezvous", "discovery", "checkpoint", "worker", "examples", "launch")


def _declared_packages() -> tuple[list[str], dict[str, str]]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return config["packages"], config["package-dir"]


def test_every_package_folder_is_in_the_wheels_list_and_nothing_else() -> None:
    """Each folder with an `__init__.py` under the mapped folders is a package of the wheel,
    named by the longest mapping that holds it (`worker/torch/elastic` is `ringmaster.torch.elastic`):
    a new subpackage left out of pyproject.toml's list fails here, not in a user's install."""
    packages, mapping = _declared_packages()
    by_folder = {folder: name for name, folder in mapping.items()}
    found = set()
    for top in PACKAGE_DIRS_TO_SCAN:
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            folder = init.parent.relative_to(ROOT).as_posix()
            holder = max((f for f in by_folder if folder == f or folder.startswith(f + "/")), key=len)
            rest = folder[len(holder):].strip("/")
            found.add(by_folder[holder] + ("." + rest.replace("/", ".") if rest else ""))
    assert sorted(found) == sorted(packages)
