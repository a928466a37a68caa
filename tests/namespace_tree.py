"""The installed `ringmaster` namespace as a tree of links, for tools that read files rather
than import (mypy): pyproject.toml maps the repository's folders under `ringmaster`, and an
editable install resolves that mapping with an import hook that static tools cannot follow."""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, pathlib.Path]:
    """pyproject.toml's package-dir: dotted package -> folder in the repository."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {name: ROOT / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def link_tree(into: pathlib.Path) -> pathlib.Path:
    """Lay out the namespace under `into` (one link per file or sub-folder) and return `into`.

    A folder mapped on its own (worker/torch as ringmaster.torch) is left out of its parent's
    copy, so each module has one name, as in the installed wheel."""
    mapped = package_dirs()
    mapped_sources = {path.resolve() for path in mapped.values()}
    for name, source in mapped.items():
        target = into.joinpath(*name.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for child in source.iterdir():
            if child.name == "__pycache__" or (child.is_dir() and child.resolve() in mapped_sources):
                continue
            link = target / child.name
            if not link.exists():
                link.symlink_to(child)
    return into
