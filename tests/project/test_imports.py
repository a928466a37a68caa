"""Every `ringmaster` import written anywhere (tests, benches, examples, the packages; inside
functions too, such as a GPU-only test that never runs here) names something that exists.

The modules to check are found by a quick scan of the text at collection time (both pytest
workers collect: parsing every file there cost each 3.4 s); one test parses every file and
checks that the scan missed no import the syntax tree has."""

from __future__ import annotations

import ast
import functools
import importlib
import re

import pytest
from harness import ROOT

FOLDERS = ("tests", "bench", "examples", "ringmaster", "rendezvous", "worker", "discovery", "checkpoint", "proto",
           "launch")
#: `from ringmaster.x import ...` and `import ringmaster.x[, ...]` at any indentation.
IMPORT_LINE = re.compile(r"^\s*(?:from\s+(ringmaster(?:\.\w+)*)\s+import\b|import\s+(ringmaster(?:\.\w+)*))", re.M)


def _sources():
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, path.read_text()


def _scanned_modules() -> set[str]:
    return {a or b for _, text in _sources() for a, b in IMPORT_LINE.findall(text)}


@functools.cache
def _imports() -> tuple[tuple[str, int, str, str | None], ...]:
    """(file, line, module, name or None) of every import of the ringmaster namespace."""
    found = []
    for path, text in _sources():
        tree = ast.parse(text, str(path))
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node,
                          ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "ringmaster":
                found += [(where, node.lineno, node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(where, node.lineno, alias.name, None) for alias in node.names
                          if alias.name.split(".")[0] == "ringmaster"]
    return tuple(found)


SCANNED = sorted(_scanned_modules())


def test_the_scan_sees_the_imports() -> None:
    imports = _imports()
    assert len(imports) > 200 and any(f == "tests/e2e/test_gpu.py" for f, *_ in imports)
    missed = {m for _, _, m, _ in imports} - set(SCANNED)
    assert not missed, f"the text scan missed imports of {sorted(missed)}: widen IMPORT_LINE"


@pytest.mark.parametrize("module", SCANNED)
def test_every_imported_name_exists(module: str) -> None:
    imported = importlib.import_module(module)
    for where, line, _, name in [i for i in _imports() if i[2] == module and i[3] is not None]:
        if name == "*" or hasattr(imported, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ModuleNotFoundError:
            pytest.fail(f"{where}:{line}: `from {module} import {name}`: {module} has no {name}")
