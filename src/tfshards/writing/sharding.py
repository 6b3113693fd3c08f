"""Shard planning as pure functions: record order, shard sizes and names."""

from __future__ import annotations

import math
import random
from array import array

from tfshards.errors import ConfigError

DEFAULT_TARGET_SHARD_BYTES = 128 << 20  # 100-200 MB: long sequential reads from object stores
MIN_SHARDS = 16  # enough files for parallel reads and a shard-file val split, on any worker count


def shuffled_order(num_records: int, seed: int) -> list[int]:
    """A permutation of ``range(num_records)`` that depends only on ``seed``.

    ``random.Random`` (Mersenne Twister + ``shuffle``) gives the same
    permutation for the same seed across CPython versions and platforms, and
    does not depend on how many workers later write the shards.
    """
    order = list(range(num_records))
    random.Random(seed).shuffle(order)
    return order


def shuffled_indices(num_records: int, seed: int) -> array[int]:
    """:func:`shuffled_order` as 4-byte unsigned ints: 4 MB for a million records.

    ``Random.shuffle`` swaps items of any mutable sequence in the same order,
    so the permutation is the same as the list's.
    """
    if num_records >= 1 << 32:
        raise ConfigError(f"expected fewer than 2**32 records, got {num_records}")
    order = array("I", range(num_records))
    random.Random(seed).shuffle(order)
    return order


def shard_boundaries(num_records: int, num_shards: int) -> list[int]:
    """Start offsets of each shard plus the end: ``num_shards + 1`` values.

    Shard sizes differ by at most one record.
    """
    if num_shards < 1:
        raise ConfigError(f"num_shards must be >= 1, got {num_shards}")
    return [(i * num_records) // num_shards for i in range(num_shards + 1)]


def auto_num_shards(num_records: int, total_bytes: int, target_shard_bytes: int) -> int:
    """How many shards to cut ``total_bytes`` into when the user gave no count.

    At least :data:`MIN_SHARDS` (never more than one per record), more when the
    data would make shards larger than ``target_shard_bytes``.
    """
    if target_shard_bytes < 1:
        raise ConfigError(f"target_shard_bytes must be >= 1, got {target_shard_bytes}")
    by_size = math.ceil(total_bytes / target_shard_bytes)
    return max(1, min(num_records, max(MIN_SHARDS, by_size)))


def shard_name(name: str, index: int, count: int) -> str:
    """``<name>-00003-of-00016.tfrecord``, the layout TFDS made familiar."""
    return f"{name}-{index:05d}-of-{count:05d}.tfrecord"
