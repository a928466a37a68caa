"""Every `ringmaster` import written anywhere (tests, benches, examples, the packages; inside
functions too, such as a GPU-only test that never runs here) names something that exists."""

from __future__ import annotations

import ast
import importlib

import pytest

from harness import ROOT

FOLDERS = ("tests", "bench", "examples", "ringmaster", "rendezvous", "worker", "discovery", "checkpoint", "proto")


def _imports() -> list[tuple[str, int, str, str | None]]:
    """(file, line, module, name or None) of every import of the ringmaster namespace."""
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            where = str(path.relative_to(ROOT))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "ringmaster":
                    found += [(where, node.lineno, node.module, alias.name) for alias in node.names]
                elif isinstance(node, ast.Import):
                    found += [(where, node.lineno, alias.name, None) for alias in node.names
                              if alias.name.split(".")[0] == "ringmaster"]
    return found


IMPORTS = _imports()


def test_the_scan_sees_the_imports() -> None:
    assert len(IMPORTS) > 200 and any(f == "tests/e2e/test_gpu.py" for f, *_ in IMPORTS)


@pytest.mark.parametrize("module", sorted({m for _, _, m, _ in IMPORTS}))
def test_every_imported_name_exists(module: str) -> None:
    imported = importlib.import_module(module)
    for where, line, _, name in [i for i in IMPORTS if i[2] == module and i[3] is not None]:
        if name == "*" or hasattr(imported, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ModuleNotFoundError:
            pytest.fail(f"{where}:{line}: `from {module} import {name}`: {module} has no {name}")
