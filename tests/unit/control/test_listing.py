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


def test_a_resets_causes_say_eight_and_count_the_rest_once_each() -> None:
    from ringmaster.rendezvous.control.records import Causes, ResetCause

    causes = Causes()
    for i in range(30):
        causes.add(f"worker h{i}/1 failed", ResetCause.FAILURE)
        causes.add(f"worker h{i}/1 failed", ResetCause.FAILURE)  # said twice, counted once
    text, kinds = causes.take(is_reset=True)
    assert text.startswith("worker h0/1 failed; worker h1/1 failed") and text.endswith("; ... (30 causes in all)"), text
    assert text.count("failed") == 8 and kinds == [ResetCause.FAILURE.value]
    assert causes.take(is_reset=False) == ("job start", [])
