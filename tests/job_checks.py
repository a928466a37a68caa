"""What the logs of a finished elastic job must show (`tests/workloads/elastic_job.py` writes them).

Pure checks over the per-worker JSON lines, shared by the end-to-end tests, the chaos test and
`bench/chaos.py`.
"""

from __future__ import annotations

from harness import events


def padding_bound(logs: dict[str, list[dict]], epoch: int) -> int:
    """The most samples `ElasticSampler` may repeat in `epoch`: each deal of what was left to a
    ring whose size does not divide it pads the last step with up to size-1 repeats. Deals are
    what each (re-)entry into training logs as `synced` (the deal at an epoch's start deals the
    whole data set, which the tests size to divide by every world size)."""
    deals = {(r["generation"], r["left"], r["size"]) for r in events(logs, "synced") if r.get("epoch") == epoch and "left" in r}
    return sum(-left % size for _, left, size in deals)


def assert_every_sample_once(logs: dict[str, list[dict]], epochs: int, allow_padding: bool = False) -> None:
    """Each epoch ended with every sample seen exactly once by the committed model. With
    `allow_padding`, an epoch in which a ring was dealt a remainder it does not divide may repeat
    up to the sampler's padding (see `padding_bound`), never skip a sample."""
    records = events(logs, "epoch")
    assert sorted(r["epoch"] for r in records) == list(range(epochs)), records
    for r in records:
        assert r["min"] == 1.0, f"epoch {r['epoch']}: some sample was never seen (min {r['min']})"
        if allow_padding and "total" in r and r["max"] <= 2.0:
            samples = r["samples"]
            repeats = r["total"] - samples
            assert repeats <= padding_bound(logs, r["epoch"]), \
                f"epoch {r['epoch']}: {repeats:g} samples repeated, more than the sampler's padding allows"
        else:
            assert r["max"] == 1.0, f"epoch {r['epoch']}: samples seen between {r['min']} and {r['max']} times"


def assert_ranks_agree(logs: dict[str, list[dict]]) -> None:
    """In each generation, every rank started from the same step and bit-identical state, with
    the ranks 0..size-1; and every rank ended with the same state."""
    by_generation: dict[int, list[dict]] = {}
    for record in events(logs, "synced"):
        by_generation.setdefault(record["generation"], []).append(record)
    assert by_generation, "no worker logged a sync"
    for generation, records in sorted(by_generation.items()):
        states = {r["worker"]: (r["step"], r.get("digest", r["checksum"])) for r in records}
        assert len(set(states.values())) == 1, f"generation {generation}: replicas differ: {states}"
        assert sorted(r["rank"] for r in records) == list(range(records[0]["size"])), records
    done = {r["worker"]: r.get("digest", r["checksum"]) for r in events(logs, "done")}
    assert done and len(set(done.values())) == 1, f"replicas differ at the end: {done}"
