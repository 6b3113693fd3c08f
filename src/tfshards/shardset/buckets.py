"""Split buckets: a record's side of the train/validation split is a property of its key.

Each record hashes into one of ``count`` buckets by its key alone (the path
relative to the listing's root, or its ``group_by`` group), never by how many
other records exist, and a shard holds the records of one bucket. The loader
gives validation whole buckets chosen with the split seed
(:func:`tfshards.shardset.split.split`), so adding or removing files never moves
a surviving record across the split, and it still reads whole shard files.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import TypeGuard

DEFAULT_BUCKETS = 16  # validation fractions in steps of 1/16 (0.2 asks for 3: 0.1875)
# Fractions in steps of 1/65,536 are finer than any split needs; the writer keeps a list
# of members per bucket (5,000,000 buckets of 9 files took 558 MB and 5.6 s).
MAX_BUCKETS = 1 << 16


def is_count(value: object) -> TypeGuard[int]:
    """A bucket count a set may have: a whole number (never a bool) in [1, MAX_BUCKETS]."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_BUCKETS


def bucket_of(key: str, count: int) -> int:
    """The bucket of ``key`` among ``count``: the first 8 bytes of its SHA-256, modulo ``count``.

    The same on every machine and Python (no ``hash()``, which is salted per process).
    """
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % count


def crossings(left: Sequence[int | None], arrived: Sequence[int | None]) -> int:
    """How many files with the same bytes changed bucket, at the least: copies of one
    content left buckets ``left`` (removed, or their path holds other bytes now) and
    arrived in buckets ``arrived`` (added, or at a path that held other bytes).

    Each departure pairs with one arrival; a pair in one bucket is no crossing, and
    the count does not depend on which copy is taken for which.
    """
    pairs = min(len(left), len(arrived))
    before, after = Counter(left), Counter(arrived)
    stay = sum(min(n, after[b]) for b, n in before.items())
    return max(0, pairs - stay)
