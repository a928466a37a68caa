"""Tests of one `xdist_group` run on one pytest-xdist worker again (`--dist loadgroup`).

pytest-xdist 3.8 names a test's group by assigning `item._nodeid`, which pytest 9 no longer
reads (a node's id is `item._id`): every group was split over both workers. The Ray module
started its cluster twice (once past 100 s beside the other worker's jobs), and the wheel and
the checkpoint cases were built twice. Applied after xdist's own hook, on its workers only.
"""

from __future__ import annotations

import pytest


def group_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Suffix each grouped test's id with `@<group>` as xdist's scheduler expects, where xdist's
    own suffix did not take."""
    if not getattr(config.option, "loadgroup", False):  # (set on xdist's workers under --dist loadgroup)
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid.rsplit("]", 1)[-1] and hasattr(item, "_id"):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    group_items(config, items)
