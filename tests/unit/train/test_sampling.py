"""ElasticSampler's arithmetic: across resets and resizes every sample is processed once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ringmaster.worker.train import sampling


@given(st.integers(0, 200), st.integers(1, 9), st.integers(0, 5), st.booleans())
def test_rank_shares_cover_what_is_left(num_samples, size, epoch, shuffle) -> None:
    order = sampling.epoch_order(num_samples, epoch, seed=3, shuffle=shuffle)
    assert sorted(order) == list(range(num_samples))
    shares = [sampling.rank_share(order, r, size) for r in range(size)]
    assert len({len(s) for s in shares}) <= 1  # every rank has the same number of batches
    flat = [i for s in shares for i in s]
    assert set(flat) == set(order)
    assert len(flat) - num_samples == (-num_samples) % size if num_samples else len(flat) == 0


@settings(max_examples=300)
@given(st.data())
def test_each_sample_once_across_resizes(data) -> None:
    """Simulate training: random steps at random sizes, each ring's batch recorded as processed.

    Every sample is processed; a repeat happens only as padding, when what is left does not
    divide by the new world size (at most size-1 repeats per such phase), and never otherwise.
    """
    batch = data.draw(st.integers(1, 4))
    sizes = data.draw(st.lists(st.sampled_from([1, 2, 3, 4, 8]), min_size=1, max_size=6))
    num_samples = data.draw(st.integers(1, 80))
    order = sampling.epoch_order(num_samples, 0, seed=0, shuffle=True)
    processed: set[int] = set()
    counts = [0] * num_samples
    allowed_repeats = 0
    for position, size in enumerate(sizes):
        left = sampling.remaining(order, processed)
        if not left:
            break
        allowed_repeats += (-len(left)) % size
        steps = -(-sampling.share_length(len(left), size) // batch)
        run = steps if position == len(sizes) - 1 else data.draw(st.integers(0, steps))
        for step in range(run):
            seen_now = list(sampling.batch_of_all_ranks(left, size, step, batch))
            shares = [sampling.rank_share(left, r, size)[step * batch:(step + 1) * batch] for r in range(size)]
            assert sorted(seen_now) == sorted(i for s in shares for i in s)
            for i in seen_now:
                counts[i] += 1
            processed.update(seen_now)
    assert sampling.remaining(order, processed) == []
    assert min(counts) >= 1
    assert sum(counts) - num_samples <= allowed_repeats
    if allowed_repeats == 0:
        assert counts == [1] * num_samples
