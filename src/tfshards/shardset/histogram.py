"""Counts over fixed bins: exact below 32, then 16 bins per doubling, plus one for the rest.

A bin above 32 is at most 1/16 = 6.25% wide, so a median read from the bins
is within ~3% of the true one, and a histogram's size is fixed by the bits
of the largest value it bins (209 bins up to 2**16, 529 up to 2**36),
whatever the number of values. Adding and merging are sums, in any order.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

EXACT = 32  # values below are their own bin
PER_OCTAVE = 16  # bins per doubling above EXACT


def bin_count(bits: int) -> int:
    """Bins for values below ``2**bits`` (exact below :data:`EXACT`), plus one for the rest."""
    return EXACT + (bits - EXACT.bit_length() + 1) * PER_OCTAVE + 1


def bin_of(value: int, bins: int) -> int:
    """The bin of ``value`` (>= 0) among ``bins``."""
    if value < EXACT:
        return value
    e = value.bit_length() - 1
    b = EXACT + (e - 5) * PER_OCTAVE + ((value >> (e - 4)) & (PER_OCTAVE - 1))
    return min(b, bins - 1)


def bins_of(values: np.ndarray, bins: int) -> np.ndarray:
    """:func:`bin_of` of each of ``values`` (int64, >= 0): one search of the bins' low ends."""
    return np.searchsorted(_lows(bins), values, side="right") - 1


@functools.cache
def _lows(bins: int) -> np.ndarray:
    return np.array([bin_bounds(b)[0] for b in range(bins)], dtype=np.int64)


def bin_bounds(b: int) -> tuple[int, int]:
    """``[low, high)`` of bin ``b`` (the last bin of a histogram also holds all above)."""
    if b < EXACT:
        return b, b + 1
    e, sub = divmod(b - EXACT, PER_OCTAVE)
    return (PER_OCTAVE + sub) << (e + 1), (PER_OCTAVE + sub + 1) << (e + 1)


@dataclass
class Histogram:
    """Counts over fixed bins, with the exact smallest and largest value seen."""

    counts: list[int]
    low: int = 0
    high: int = 0
    total: int = 0

    @classmethod
    def empty(cls, bits: int) -> Histogram:
        return cls([0] * bin_count(bits))

    def add(self, value: int) -> None:
        if not self.total or value < self.low:
            self.low = value
        if value > self.high:
            self.high = value
        self.total += 1
        self.counts[bin_of(value, len(self.counts))] += 1

    def add_many(self, values: np.ndarray) -> None:
        """Each of ``values`` (int64): :meth:`add` for a whole batch."""
        if not len(values):
            return
        low, high = int(values.min()), int(values.max())
        self.low = low if not self.total else min(self.low, low)
        self.high = max(self.high, high)
        self.total += len(values)
        found = np.bincount(bins_of(values, len(self.counts)), minlength=len(self.counts))
        self.counts = (np.asarray(self.counts, dtype=np.int64) + found).tolist()

    def merge(self, other: Histogram) -> None:
        if other.total:
            self.low = other.low if not self.total else min(self.low, other.low)
            self.high = max(self.high, other.high)
        self.total += other.total
        if len(other.counts) != len(self.counts):
            raise ValueError(f"expected {len(self.counts)} bins, found {len(other.counts)}")
        self.counts = list(map(operator.add, self.counts, other.counts))

    def median(self) -> int:
        """The lower median: exact below :data:`EXACT`, else its bin's middle (within min..max)."""
        rank, seen = (self.total - 1) // 2, 0
        for b, n in enumerate(self.counts):
            seen += n
            if seen > rank:
                low, high = bin_bounds(b)
                return min(max((low + high - 1) // 2, self.low), self.high)
        return 0

    def to_json(self) -> dict[str, Any]:
        return {"counts": self.counts, "max": self.high, "min": self.low}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], bits: int) -> Histogram:
        counts = list(map(int, doc["counts"]))
        if len(counts) != bin_count(bits):
            raise ValueError(f"expected {bin_count(bits)} bins, found {len(counts)}")
        return cls(counts, int(doc["min"]), int(doc["max"]), sum(counts))
