"""What the logs of a finished elastic job must show (`tests/workloads/elastic_job.py` writes them).

Pure checks over the per-worker JSON lines, shared by the end-to-end tests, the chaos test and
`bench/chaos.py`.
"""

from __future__ import annotations

from typing import Collection

from harness import events


def padding_bound(logs: dict[str, list[dict]], epoch: int) -> int:
    """The most samples `ElasticSampler` may repeat in `epoch`: each deal of what was left to a
    ring whose size does not divide it pads the last step with up to size-1 repeats. Deals are
    what each (re-)entry into training logs as `synced` (the deal at an epoch's start deals the
    whole data set, which the tests size to divide by every world size)."""
    deals = {
        (r["generation"], r["left"], r["size"])
        for r in events(logs, "synced")
        if r.get("epoch") == epoch and "left" in r
    }
    return sum(-left % size for _, left, size in deals)


def epochs_ended(logs: dict[str, list[dict]]) -> int:
    """How many epochs the job's logs show ended (a job trained until told to stop ends where it
    was told, not at a count the test knew)."""
    return 1 + max(r["epoch"] for r in events(logs, "epoch"))


def assert_every_sample_once(logs: dict[str, list[dict]], epochs: int | None = None) -> None:
    """Each of `epochs` epochs (None: every epoch the logs show ended) ended with every sample
    seen by the committed model: never skipped, and
    repeated only as the sampler pads a ring dealt a remainder it does not divide (see
    `padding_bound`, which is 0 for an epoch whose every deal divided, so then each sample was
    seen exactly once). Which rings a job forms mid-epoch depends on timing (workers that become
    ready a moment apart form two generations), so every test allows the padding its own logs
    show, and no more.

    Rank 0 logs an epoch's end before the commit that closes it, so a fault between the two rolls
    the job back into the epoch, which ends (and is logged) again. An epoch is entered once per
    end of the one before it that was logged (a whole job started again from a checkpoint older
    than that end ends it again), and once by each generation that synced inside it (epoch 0 by
    the job's first sync); it may be logged once per entry, and each of its records must hold."""
    records = events(logs, "epoch")
    if epochs is None:
        epochs = epochs_ended(logs)
    assert sorted({r["epoch"] for r in records}) == list(range(epochs)), records
    syncs = events(logs, "synced")
    for epoch in range(epochs):
        logged = [r for r in records if r["epoch"] == epoch]
        synced_in = {r["generation"] for r in syncs if r.get("epoch") == epoch}
        entries = len(synced_in) + sum(1 for r in records if r["epoch"] == epoch - 1)
        assert len(logged) <= max(1, entries), \
            f"epoch {epoch} ended {len(logged)} times but was entered {entries} times: {logged}"
    assert_seen_once_or_padded(logs, records)


def assert_seen_once_or_padded(logs: dict[str, list[dict]], records: list[dict]) -> None:
    """Each of these epoch records saw every sample, repeated only as far as `padding_bound`
    allows for its epoch (so exactly once where every deal divided). For a test that reads only
    some epochs (those after a crash, or of a second run); `assert_every_sample_once` checks all."""
    for r in records:
        assert r["min"] == 1.0, f"epoch {r['epoch']}: some sample was never seen (min {r['min']})"
        repeats = r["total"] - r["samples"]
        allowed = padding_bound(logs, r["epoch"])
        assert repeats <= allowed, (f"epoch {r['epoch']}: samples seen between {r['min']} and {r['max']} times, "
                                    f"{repeats:g} repeats where the sampler's padding allows {allowed}")


def assert_ranks_agree(logs: dict[str, list[dict]], cut_short: Collection[int] = ()) -> None:
    """In each generation, every rank started from the same step and bit-identical state, with
    the ranks 0..size-1; and every rank ended with the same state. `cut_short`: generations
    whose members a fault killed, maybe before they logged their sync: the ranks they logged
    are distinct and below the size, not necessarily all of them."""
    by_generation: dict[int, list[dict]] = {}
    for record in events(logs, "synced"):
        by_generation.setdefault(record["generation"], []).append(record)
    assert by_generation, "no worker logged a sync"
    for generation, records in sorted(by_generation.items()):
        states = {r["worker"]: (r["step"], r.get("digest", r["checksum"])) for r in records}
        assert len(set(states.values())) == 1, f"generation {generation}: replicas differ: {states}"
        ranks = sorted(r["rank"] for r in records)
        if generation in cut_short:
            assert len(set(ranks)) == len(ranks) and set(ranks) <= set(range(records[0]["size"])), records
        else:
            assert ranks == list(range(records[0]["size"])), records
    done = {r["worker"]: r.get("digest", r["checksum"]) for r in events(logs, "done")}
    assert done and len(set(done.values())) == 1, f"replicas differ at the end: {done}"
