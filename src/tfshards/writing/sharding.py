"""Shard planning as pure functions: record order, shard sizes and names, by record or group."""

from __future__ import annotations

import bisect
import itertools
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


def grouped_indices(
    groups: array[int], num_groups: int, num_shards: int, seed: int
) -> tuple[array[int], list[int]]:
    """Record order and shard boundaries that keep every group in one shard.

    ``groups[i]`` is record ``i``'s group id in ``range(num_groups)``, each id
    used at least once. The groups are shuffled with ``seed``, packed in that
    order into ``num_shards`` contiguous runs (each run ends at the group whose
    end is closest to an even share of the records not yet placed, so sizes
    balance as far as whole groups in that order allow; a group larger than a
    shard is a larger shard of its own, never split), then each shard's
    records are shuffled, all with one ``random.Random(seed)``, drawn in that
    order. Needs ~12 bytes per record.

    Returns:
        The record indices in write order (4-byte unsigned ints) and the
        ``num_shards + 1`` offsets into it where each shard starts, plus the end.
    """
    if not 1 <= num_shards <= num_groups:
        raise ConfigError(
            f"num_shards: expected 1 to {num_groups} (one shard per group at most), "
            f"got {num_shards}"
        )
    sizes = array("I", bytes(4 * num_groups))
    for g in groups:
        sizes[g] += 1
    if 0 in sizes:
        raise ConfigError(f"group {sizes.index(0)} has no record: expected ids 0..{num_groups - 1}")
    starts = array("Q", itertools.accumulate(sizes, initial=0))
    members = array("I", bytes(4 * len(groups)))  # record indices, by group, in record order
    fill = array("Q", starts[:-1])
    for i, g in enumerate(groups):
        members[fill[g]] = i
        fill[g] += 1
    del fill
    rng = random.Random(seed)
    shuffled = array("I", range(num_groups))
    rng.shuffle(shuffled)
    ends = array("Q", itertools.accumulate(sizes[g] for g in shuffled))  # records after each
    total, taken = len(groups), 0
    cuts: list[int] = []
    for k in range(1, num_shards):
        done = ends[taken - 1] if taken else 0  # an even share of what is left: a large
        share = done + (total - done) / (num_shards - k + 1)  # group does not starve the rest
        j = bisect.bisect_left(ends, share, lo=taken)  # first group that reaches the share
        if j > taken and share - ends[j - 1] <= ends[j] - share:
            j -= 1  # stopping one group short is closer
        j = min(max(j, taken), num_groups - 1 - (num_shards - k))  # one group left per shard
        cuts.append(j + 1)
        taken = j + 1
    order = array("I")
    bounds = [0]
    for lo, hi in itertools.pairwise([0, *cuts, num_groups]):
        shard = array("I")
        for g in shuffled[lo:hi]:
            shard.extend(members[starts[g] : starts[g + 1]])
        rng.shuffle(shard)
        order.extend(shard)
        bounds.append(len(order))
    return order, bounds
