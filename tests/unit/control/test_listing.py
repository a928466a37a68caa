"""Names in a message, bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ringmaster.rendezvous.control.listing import listed


@given(st.lists(st.text(alphabet="abc/0123", min_size=1, max_size=6), max_size=40), st.integers(1, 12))
def test_a_few_names_are_listed_and_the_rest_counted(names: list[str], shown: int) -> None:
    text = listed(names, shown)
    if len(names) <= shown:
        assert text == ", ".join(names)
    else:
        assert text == ", ".join(names[:shown]) + f", ... ({len(names)} in all)"
    assert len(text) <= shown * 8 + 30
