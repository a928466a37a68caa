"""A version a user can name: each commit builds its own (setuptools-scm reads git), a tag
`vX.Y.Z` names a release, and the installed package, `ringmaster --version` and the services
say the same one."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys

from harness import copy_checkout

import ringmaster


def _git(where: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()


def test_two_commits_build_two_versions_and_a_tag_names_a_release(tmp_path: pathlib.Path) -> None:
    from setuptools_scm import get_version

    clone = tmp_path / "clone"  # (a copy, not `git clone`: a checkout another user owns is not cloned by root)
    copy_checkout(clone)
    _git(clone, "add", "-A")  # (what the checkout had uncommitted: committed in the copy, a clean start)
    _git(clone, "commit", "-qm", "the checkout's changes", "--allow-empty")
    tags = _git(clone, "tag").split()
    if tags:  # as a clone without tags
        _git(clone, "tag", "-d", *tags)
    first = get_version(root=str(clone))
    (clone / "README.md").write_text((clone / "README.md").read_text() + "\nA change.\n")
    _git(clone, "commit", "-qam", "a change")
    second = get_version(root=str(clone))
    assert first != second and _git(clone, "rev-parse", "--short=7", "HEAD") in second, (first, second)
    _git(clone, "tag", "v9.8.7")
    assert get_version(root=str(clone)) == "9.8.7"
    (clone / "README.md").write_text((clone / "README.md").read_text() + "\nAnother.\n")
    _git(clone, "commit", "-qam", "after the release")
    after = get_version(root=str(clone))
    assert after.startswith("9.8.8.dev1+g"), after  # one commit past 9.8.7, and from which commit


def test_the_installed_version_is_what_the_command_says() -> None:
    assert ringmaster.__version__ == importlib.metadata.version("ringmaster")
    assert ringmaster.__version__ != "0.0.0+unknown", "installed without git: setuptools-scm could not tell"
    said = subprocess.run([sys.executable, "-m", "ringmaster.cli", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert said.returncode == 0 and said.stdout.strip() == f"ringmaster {ringmaster.__version__}"
