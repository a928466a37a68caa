"""The checked-in gRPC stubs must be what `python -m ringmaster.proto.generate` makes from the .proto."""

import pathlib

from ringmaster.proto.generate import GENERATED, PROTO_DIR, generate


def test_checked_in_stubs_match_the_proto(tmp_path: pathlib.Path) -> None:
    fresh = generate(tmp_path)
    for path in fresh:
        checked_in = PROTO_DIR / path.name
        assert checked_in.read_text() == path.read_text(), (
            f"proto/{path.name} is stale: run `python -m ringmaster.proto.generate` and commit the result"
        )
    assert sorted(p.name for p in fresh) == sorted(GENERATED)
