"""The end-to-end tests' sample checks (`job_checks`) fail where they must.

The logs are built here in the shape `tests/workloads/elastic_job.py` writes them; the first one
is what CI recorded for a job grown from 2 to 4 workers whose two new workers became ready a
moment apart, near an epoch's end (a ring of 3 dealt 8 samples, then a ring of 4 dealt 2).
"""

from __future__ import annotations

import pytest
from job_checks import assert_every_sample_once, assert_seen_once_or_padded


def synced(generation: int, epoch: int, left: int, size: int) -> dict:
    return {"event": "synced", "generation": generation, "rank": 0, "size": size, "epoch": epoch, "left": left}


def ended(epoch: int, total: float, least: float = 1.0, most: float = 1.0, samples: int = 192) -> dict:
    return {"event": "epoch", "epoch": epoch, "min": least, "max": most, "total": total, "samples": samples}


def grown_near_the_end(total: float, least: float = 1.0, deal_left: int = 2) -> dict[str, list[dict]]:
    """Epoch 0 clean; epoch 1 entered by generation 2 (3 workers, 8 left) and 3 (4 workers)."""
    return {"hostA_1": [synced(1, 0, 192, 4), ended(0, 192.0),
                        synced(2, 1, 8, 3), synced(3, 1, deal_left, 4), ended(1, total, least, 2.0)]}


def test_repeats_within_the_padding_of_the_rings_dealt_a_remainder_pass() -> None:
    assert_every_sample_once(grown_near_the_end(total=194.0), 2)  # 2 repeats; 8 on 3 pads 1, 2 on 4 pads 2


def test_repeats_beyond_that_padding_fail() -> None:
    with pytest.raises(AssertionError, match="4 repeats where the sampler's padding allows 3"):
        assert_every_sample_once(grown_near_the_end(total=196.0), 2)


def test_a_repeat_where_every_deal_divided_fails() -> None:
    logs = {"hostA_1": [synced(1, 0, 192, 4), ended(0, 193.0, most=2.0), ended(1, 192.0)]}
    with pytest.raises(AssertionError, match="epoch 0: samples seen between 1.0 and 2.0 times, 1 repeats"):
        assert_every_sample_once(logs, 2)


def test_a_skipped_sample_fails_even_within_the_padding() -> None:
    with pytest.raises(AssertionError, match="epoch 1: some sample was never seen"):
        assert_every_sample_once(grown_near_the_end(total=193.0, least=0.0), 2)


def test_an_epoch_logged_twice_without_being_entered_again_fails() -> None:
    logs = {"hostA_1": [synced(1, 0, 192, 4), ended(0, 192.0), ended(0, 192.0), ended(1, 192.0)]}
    with pytest.raises(AssertionError, match="epoch 0 ended 2 times but was entered 1 times"):
        assert_every_sample_once(logs, 2)


def test_epochs_ended_again_after_a_restart_from_an_older_checkpoint_pass() -> None:
    """The whole job died after ending epochs 0 and 1 and started again from a checkpoint in
    epoch 0 (generation 3): it ends epoch 0 again, and so enters and ends epoch 1 again."""
    logs = {"hostA_1": [synced(1, 0, 192, 4), ended(0, 192.0), ended(1, 192.0),
                        synced(3, 0, 96, 4), ended(0, 192.0), ended(1, 192.0)]}
    assert_every_sample_once(logs, 2)


def test_a_ring_of_three_dealt_sixteen_may_pad_two_and_only_in_that_epoch() -> None:
    """CI's job on hosts with their own network: grown from 2 to 3 with 16 samples of 384 left."""
    logs = {"hostA_1": [synced(1, 0, 384, 2), synced(2, 0, 16, 3), synced(3, 0, 0, 2),
                        ended(0, 386.0, most=2.0, samples=384), ended(1, 386.0, most=2.0, samples=384)]}
    with pytest.raises(AssertionError, match="epoch 1: samples seen between 1.0 and 2.0 times, 2 repeats where the "
                                             "sampler's padding allows 0"):
        assert_every_sample_once(logs, 2)
    assert_seen_once_or_padded(logs, logs["hostA_1"][3:4])
