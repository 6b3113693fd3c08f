"""A mix's schedule: exact counts per epoch, seeded, and seekable to each source's position."""

from __future__ import annotations

import numpy as np
import pytest

from tfshards.errors import ConfigError
from tfshards.reading.epochorder import Position
from tfshards.reading.mixplan import MixPlan, largest_remainder


def test_largest_remainder_sums_to_the_total_within_one_of_the_exact_share():
    for weights in ([0.7, 0.3], [1 / 3] * 3, [0.5, 0.25, 0.125, 0.125], [0.01, 0.99]):
        w = np.asarray(weights)
        for total in (1, 7, 100, 214, 999):
            counts = largest_remainder(w, total)
            assert counts.sum() == total
            assert np.all(np.abs(counts - w * total) < 1)
    assert largest_remainder(np.asarray([0.5, 0.5]), 3).tolist() == [2, 1]  # ties: lower index


def test_default_epoch_size_is_the_largest_with_no_source_repeating():
    plan = MixPlan([150, 90], [0.7, 0.3], seed=0)
    assert plan.epoch_size == 214 and plan.counts.tolist() == [150, 64]
    assert MixPlan([700, 300], [7, 3], seed=0).counts.tolist() == [700, 300]  # weights normalized
    assert MixPlan([150, 90], [0.7, 0.3], seed=0, epoch_size=1000).counts.tolist() == [700, 300]


def test_each_epoch_is_a_seeded_permutation_of_the_exact_counts():
    plan = MixPlan([150, 90], [0.7, 0.3], seed=5)
    for epoch in range(3):
        assert np.bincount(plan.schedule(epoch)).tolist() == [150, 64]
    assert plan.schedule(0).tolist() != plan.schedule(1).tolist()
    again = MixPlan([150, 90], [0.7, 0.3], seed=5)
    assert again.schedule(1).tolist() == plan.schedule(1).tolist()
    other = MixPlan([150, 90], [0.7, 0.3], seed=6)
    assert other.schedule(1).tolist() != plan.schedule(1).tolist()
    assert len({plan.source_seed(0), plan.source_seed(1), other.source_seed(0)}) == 3


@pytest.mark.parametrize("start", [(0, 0), (0, 17), (1, 0), (1, 213), (2, 100), (0, 214 * 2 + 5)])
def test_a_position_maps_to_what_each_source_has_read(start):
    plan = MixPlan([150, 90], [0.7, 0.3], seed=1)
    begin = plan.position(start)
    stream = np.concatenate([plan.schedule(e) for e in range(begin.epoch + 1)])
    prefix = stream[: begin.epoch * 214 + begin.record]
    assert plan.consumed(begin) == np.bincount(prefix, minlength=2).tolist()
    starts = plan.source_starts(begin)
    assert starts == [
        Position.after(n, size) for n, size in zip(plan.consumed(begin), [150, 90], strict=True)
    ]
    assert plan.position((0, 214 * 2 + 5)) == Position(2, 5)


@pytest.mark.parametrize(
    ("sizes", "weights", "match"),
    [
        ([10, 10], [1.0], "one weight per source"),
        ([10, 10], [1.0, 0.0], "finite numbers > 0"),
        ([10, 10], [1.0, float("nan")], "finite numbers > 0"),
        ([10, 0], [1.0, 1.0], ">= 1 record"),
    ],
)
def test_bad_sources_are_config_errors(sizes, weights, match):
    with pytest.raises(ConfigError, match=match):
        MixPlan(sizes, weights, seed=0)


@pytest.mark.parametrize(
    ("weights", "epoch_size", "start", "match"),
    [
        ([1.0, "0.5"], None, None, "weights must be finite numbers > 0"),
        ([1.0, True], None, None, "weights must be finite numbers > 0"),
        ([1.0, 1.0], "10", None, "epoch_size must be an integer >= 1, got '10'"),
        ([1.0, 1.0], 10.5, None, "epoch_size must be an integer >= 1, got 10.5"),
        ([1.0, 1.0], 10, (0, 1.5), r"start must be \(epoch, record\)"),
        ([1.0, 1.0], 10, (1,), r"start must be \(epoch, record\), got \(1,\)"),
    ],
)
def test_values_of_the_wrong_type_are_config_errors_not_python_errors(
    weights, epoch_size, start, match
):
    with pytest.raises(ConfigError, match=match):
        MixPlan([10, 10], weights, seed=0, epoch_size=epoch_size).position(start)


def test_huge_weights_keep_their_shares():
    plan = MixPlan([10, 10], [1e308, 1e308], seed=0, epoch_size=10)
    assert plan.counts.tolist() == [5, 5]
