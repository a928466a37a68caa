"""Produce the gRPC stubs in `proto/` from `proto/ringmaster.proto`.

Run as `python -m proto.generate` from the repository root. The stubs are checked in so that
installing Ringmaster needs no code generator; `tests/test_proto_stubs.py` fails when they are
stale. `--out DIR` writes elsewhere (the test compares such a fresh copy with the checked-in one).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

PROTO_DIR = pathlib.Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent
SOURCES = ["proto/ringmaster.proto"]
GENERATED = ["ringmaster_pb2.py", "ringmaster_pb2.pyi", "ringmaster_pb2_grpc.py"]


def generate(out_root: pathlib.Path) -> list[pathlib.Path]:
    """Run protoc (from grpcio-tools) and return the paths of the files it wrote."""
    from grpc_tools import protoc  # a test/dev dependency, not needed at run time

    (out_root / "proto").mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(str(ROOT / s) for s in SOURCES),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {SOURCES}")
    return [out_root / "proto" / name for name in GENERATED]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT, help="root to write proto/*_pb2*.py under")
    written = generate(parser.parse_args().out)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
