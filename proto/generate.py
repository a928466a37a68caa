"""Produce the gRPC stubs in `proto/` from `proto/ringmaster.proto`.

Run as `python -m ringmaster.proto.generate`. The stubs import each other as
`ringmaster.proto.*` (the installed name of this folder), so protoc sees the .proto at
`ringmaster/proto/ringmaster.proto` in a staging folder. The stubs are checked in so that
installing Ringmaster needs no code generator; `tests/test_proto_stubs.py` fails when they are
stale. `--out DIR` writes elsewhere (the test compares such a fresh copy with the checked-in one).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile

PROTO_DIR = pathlib.Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent
SOURCE = PROTO_DIR / "ringmaster.proto"
#: Where the .proto sits relative to the include root: its installed package path.
STAGED = pathlib.PurePosixPath("ringmaster/proto/ringmaster.proto")
GENERATED = ["ringmaster_pb2.py", "ringmaster_pb2.pyi", "ringmaster_pb2_grpc.py"]


def generate(out_root: pathlib.Path) -> list[pathlib.Path]:
    """Run protoc (from grpcio-tools) and return the paths of the files it wrote."""
    from grpc_tools import protoc  # a test/dev dependency, not needed at run time

    with tempfile.TemporaryDirectory() as staging_dir, tempfile.TemporaryDirectory() as build_dir:
        staged = pathlib.Path(staging_dir) / STAGED
        staged.parent.mkdir(parents=True)
        shutil.copyfile(SOURCE, staged)
        args = [
            "grpc_tools.protoc",
            f"-I{staging_dir}",
            f"--python_out={build_dir}",
            f"--pyi_out={build_dir}",
            f"--grpc_python_out={build_dir}",
            str(staged),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {SOURCE}")
        (out_root / "proto").mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            shutil.copyfile(pathlib.Path(build_dir) / STAGED.parent / name, out_root / "proto" / name)
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
