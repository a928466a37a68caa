"""The rooms stay small: every class of the product under 400 lines and every function under 80,
so that a change to one decision reads one screenful or a few, and a room that grows is split
along its seams before it is 500 lines again. The product is what is installed (the packaged
folders); the generated gRPC stubs are left out."""

from __future__ import annotations

import ast

from harness import ROOT

#: The packaged folders (pyproject.toml's package-dir).
PRODUCT = ("ringmaster", "rendezvous", "worker", "checkpoint", "discovery", "proto", "launch")
GENERATED = ("ringmaster_pb2.py", "ringmaster_pb2_grpc.py", "_version.py")
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 80


def _rooms() -> list[tuple[str, str, int, int]]:
    """(file, name, lines, limit) of every class and function of the product."""
    found = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name in GENERATED or "__pycache__" in path.parts:
                continue
            where = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    found.append((where, node.name, node.end_lineno - node.lineno + 1, MAX_CLASS_LINES))
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append((where, node.name, node.end_lineno - node.lineno + 1, MAX_FUNCTION_LINES))
    return found


def test_every_class_is_under_400_lines_and_every_function_under_80() -> None:
    rooms = _rooms()
    assert len(rooms) > 1000 and any(path.startswith("worker/torch") for path, *_ in rooms)  # (the walk sees them)
    too_big = [f"{path}: {name} has {lines} lines (at most {limit})" for path, name, lines, limit in rooms
               if lines > limit]
    assert not too_big, "split these along their seams:\n" + "\n".join(too_big)

