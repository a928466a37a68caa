"""Which part may import which: the table of allowed directions (docs/architecture.md shows it
too) holds for every import in the packages, inside functions included, and has no cycle."""

from __future__ import annotations

import ast
import pathlib

import pytest
from harness import ROOT

#: Folders of the repository and the part each is (the longest match wins).
PARTS = {
    "ringmaster/settings.py": "settings",
    "proto": "proto",
    "ringmaster/common": "common",
    "discovery": "discovery",
    "launch": "launch",
    "checkpoint": "checkpoint",
    "rendezvous/control": "control",
    "rendezvous/state": "state",
    "rendezvous/server": "server",
    "rendezvous/scheduling": "scheduling",
    "rendezvous/pool": "pool",
    "worker/agent": "agent",
    "worker/train": "train",
    "worker/sharding": "sharding",
    "worker/torch": "torch",
    "ringmaster/cli": "cli",
    "ringmaster/ray": "ray",
}
#: The installed module prefix of each part.
MODULES = {
    "ringmaster.settings": "settings",
    "ringmaster.proto": "proto",
    "ringmaster.common": "common",
    "ringmaster.discovery": "discovery",
    "ringmaster.launch": "launch",
    "ringmaster.checkpoint": "checkpoint",
    "ringmaster.rendezvous.control": "control",
    "ringmaster.rendezvous.state": "state",
    "ringmaster.rendezvous.server": "server",
    "ringmaster.rendezvous.scheduling": "scheduling",
    "ringmaster.rendezvous.pool": "pool",
    "ringmaster.worker.agent": "agent",
    "ringmaster.worker.train": "train",
    "ringmaster.worker.sharding": "sharding",
    "ringmaster.torch": "torch",
    "ringmaster.cli": "cli",
    "ringmaster.ray": "ray",
}
#: What each part may import (besides itself). Read from the bottom up: settings and the wire
#: contract import nothing of ours; the decisions (control) import no I/O; the runtime
#: (server) wires decisions, state and launchers; the command line sits on top.
ALLOWED: dict[str, set[str]] = {
    "settings": set(),
    "proto": set(),
    "common": {"proto", "settings"},
    "discovery": {"common", "settings"},
    "checkpoint": {"common", "settings"},
    # How agents are started: the job's side (its rendezvous) and a host's (its pool agent) both.
    "launch": {"common", "proto", "settings"},
    "control": {"common", "discovery", "proto", "settings"},
    "state": {"common", "control", "discovery", "proto", "settings"},
    "server": {"common", "control", "state", "discovery", "launch", "proto", "settings"},
    "scheduling": set(),
    "pool": {"common", "control", "state", "server", "scheduling", "discovery", "launch", "proto", "settings"},
    "agent": {"common", "discovery", "launch", "proto", "settings"},
    "train": {"common", "checkpoint", "proto", "settings"},
    # The machinery of models sharded inside replica groups, under the user API's ShardedState.
    "sharding": {"common", "checkpoint", "proto", "settings", "train"},
    "torch": {"common", "checkpoint", "proto", "settings", "train", "sharding"},
    "cli": {"common", "control", "state", "server", "scheduling", "pool", "discovery", "launch", "proto", "settings",
            "agent"},
    # Ringmaster on Ray: a job's rendezvous in the driver, and what its workers run.
    "ray": {"common", "control", "state", "server", "discovery", "launch", "proto", "settings", "torch", "train"},
}


def _part_of_file(path: pathlib.Path) -> str | None:
    relative = str(path.relative_to(ROOT))
    for folder, part in sorted(PARTS.items(), key=lambda item: -len(item[0])):
        if relative == folder or relative.startswith(folder + "/"):
            return part
    return None


def _part_of_module(module: str) -> str | None:
    for prefix, part in sorted(MODULES.items(), key=lambda item: -len(item[0])):
        if module == prefix or module.startswith(prefix + "."):
            return part
    return None


def import_edges(root: pathlib.Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(importing part, imported part) -> where (file:line), for every import between parts."""
    edges: dict[tuple[str, str], list[str]] = {}
    for folder in {folder.split("/")[0] for folder in PARTS}:
        for path in sorted((root / folder).rglob("*.py")):
            source = _part_of_file(path)
            if source is None:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                elif isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                else:
                    continue
                for module in modules:
                    target = _part_of_module(module)
                    if target is not None and target != source:
                        edges.setdefault((source, target), []).append(f"{path.relative_to(root)}:{node.lineno}")
    return edges


def find_cycle(allowed: dict[str, set[str]]) -> list[str] | None:
    """A cycle in a table of allowed directions (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(part: str, path: list[str]) -> list[str] | None:
        state[part] = 1
        for nxt in sorted(allowed.get(part, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [*path, nxt]
            if nxt not in state:
                found = visit(nxt, [*path, nxt])
                if found:
                    return found
        state[part] = 2
        return None

    for part in sorted(allowed):
        if part not in state:
            found = visit(part, [part])
            if found:
                return found
    return None


def test_the_table_has_no_cycle_and_the_check_finds_one_added() -> None:
    assert find_cycle(ALLOWED) is None
    assert find_cycle({**ALLOWED, "control": ALLOWED["control"] | {"state"}}) == ["control", "state", "control"]
    assert find_cycle({**ALLOWED, "settings": {"server"}}) is not None


EDGES = import_edges()


def test_the_scan_sees_imports_between_parts() -> None:
    assert ("server", "control") in EDGES and ("torch", "train") in EDGES


@pytest.mark.parametrize("source, target", sorted(EDGES))
def test_every_import_goes_an_allowed_way(source: str, target: str) -> None:
    assert target in ALLOWED[source], (
        f"{source} imports {target} ({', '.join(EDGES[source, target][:3])}), which the table does not allow: "
        f"{source} may import {', '.join(sorted(ALLOWED[source])) or 'nothing of ours'}")


def test_settings_import_no_feature_module() -> None:
    assert not [target for (source, target) in EDGES if source == "settings"]
