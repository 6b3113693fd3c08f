"""Shard planning is pure: fixed order per seed, balanced sizes, familiar names."""

from __future__ import annotations

import itertools
from array import array

import pytest

from tfshards.errors import ConfigError
from tfshards.shardset import layout
from tfshards.writing import sharding


def test_shuffled_order_is_a_permutation_fixed_by_seed():
    a = sharding.shuffled_order(1000, seed=42)
    assert sorted(a) == list(range(1000))
    assert a == sharding.shuffled_order(1000, seed=42)
    assert a != sharding.shuffled_order(1000, seed=43)


def test_shuffled_order_is_stable_across_releases():
    # Pinned: a change here would silently change every shard set's bytes.
    assert sharding.shuffled_order(10, seed=0) == [7, 8, 1, 5, 3, 4, 2, 0, 9, 6]


def test_boundaries_balance_records():
    bounds = sharding.shard_boundaries(1797, 16)
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    assert bounds[0] == 0 and bounds[-1] == 1797
    assert max(sizes) - min(sizes) <= 1 and len(sizes) == 16


def test_boundaries_reject_zero_shards():
    with pytest.raises(ConfigError, match="num_shards must be >= 1, got 0"):
        sharding.shard_boundaries(10, 0)


@pytest.mark.parametrize(
    ("records", "total", "target", "expected"),
    [
        (20_000, 84_000_000, 128 << 20, 16),  # small set: the minimum keeps 16 files
        (2_000_000, 8_400_000_000, 128 << 20, 63),  # big set: by size
        (5, 1000, 128 << 20, 5),  # never more shards than records
    ],
)
def test_auto_num_shards(records, total, target, expected):
    assert sharding.auto_num_shards(records, total, target) == expected


def test_shard_name():
    assert layout.shard_name("data", 3, 16) == "data-00003-of-00016.tfrecord"


# ----------------------------------------------------------------------------- by group


def _grouped(sizes: list[int], num_shards: int, seed: int = 0) -> list[list[int]]:
    """Each shard's group ids, for records numbered group by group (``sizes[g]`` records)."""
    groups = array("I", [g for g, n in enumerate(sizes) for _ in range(n)])
    order, bounds = sharding.grouped_indices(groups, len(sizes), num_shards, seed)
    assert sorted(order) == list(range(len(groups)))  # every record once
    return [[groups[i] for i in order[a:b]] for a, b in itertools.pairwise(bounds)]


def test_every_group_lands_in_one_shard():
    shards = _grouped([7, 3, 12, 5, 9, 1, 4, 6, 8, 2, 10, 3], 4)
    seen = [set(s) for s in shards]
    assert all(a.isdisjoint(b) for a, b in itertools.combinations(seen, 2))
    assert set().union(*seen) == set(range(12))


def test_many_small_groups_balance_to_within_one_group():
    for seed in range(5):
        sizes = [len(s) for s in _grouped([3] * 100, 7, seed)]  # 300 records: 42.9 per shard
        assert sum(sizes) == 300
        assert all(abs(n - 300 / 7) < 3 for n in sizes), sizes


def test_a_group_larger_than_a_shard_is_a_larger_shard_of_its_own():
    for seed in range(5):
        shards = _grouped([50, 5, 5, 5, 5, 5, 5], 3, seed)  # 80 records: 26.7 per shard
        (big,) = [s for s in shards if 0 in s]
        assert big == [0] * 50, "never split, never shared"
        assert sorted(len(s) for s in shards if s is not big) in ([10, 20], [15, 15], [5, 25])


def test_records_within_a_shard_are_shuffled_not_group_by_group():
    shards = _grouped([10] * 8, 2, seed=3)
    assert any(s != sorted(s, key=s.index) for s in shards)  # a group's records interleave
    assert all(s != sorted(s) for s in shards)


def test_grouped_plan_is_fixed_by_seed():
    sizes = [4, 9, 2, 7, 7, 1, 3, 8]
    assert _grouped(sizes, 3, seed=1) == _grouped(sizes, 3, seed=1)
    assert _grouped(sizes, 3, seed=1) != _grouped(sizes, 3, seed=2)


def test_every_shard_gets_a_group_even_when_one_group_holds_most_records():
    shards = _grouped([1, 1, 1, 97], 4)
    assert sorted(map(len, shards)) == [1, 1, 1, 97]


def test_more_shards_than_groups_is_refused():
    with pytest.raises(ConfigError, match=r"num_shards: expected 1 to 3 \(one shard per group"):
        sharding.grouped_indices(array("I", [0, 1, 2]), 3, 4, 0)


@pytest.mark.parametrize("buckets", [0, 65_537, 100_000_000_000, True, 2.0])
def test_a_bucket_count_out_of_range_is_one_config_error(buckets):
    """5,000,000 buckets of 9 files took 558 MB and 5.6 s; 10**11 overflowed an array."""
    from tfshards.writing.config import WriteConfig

    with pytest.raises(ConfigError, match=r"^buckets must be an integer in \[1, 65536\], got "):
        WriteConfig(out="memory://x", buckets=buckets)
