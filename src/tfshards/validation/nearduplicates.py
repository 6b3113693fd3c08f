"""Find near-duplicate images across the split: perceptual hashes within a Hamming distance.

The hashes are validate's (:mod:`tfshards.validation.shardcheck` hashes each shard's
images, or reads them from :mod:`tfshards.validation.phashcache`).
Each training record is compared with the validation records whose hash lies
within ``distance`` bits, found by multi-index hashing: the 64 bits are cut
into ``distance + 1`` bands, and two hashes that differ in at most
``distance`` bits agree on at least one band whole (pigeonhole), so only
records sharing a band's value are compared: about ``n_train * n_val / 2**(64 /
(distance + 1))`` comparisons per band instead of every pair. A pair is
counted in the first band it agrees on. Payloads equal byte for byte are near
duplicates too (distance 0); :mod:`.duplicates` reports those as well.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfshards.errors import InputError
from tfshards.shardset import members

EXAMPLES = 10  # pairs kept for the report
_CHUNK = 1 << 22  # candidate pairs compared at a time: ~100 MB of arrays at most


@dataclass(frozen=True)
class NearPair:
    """A training and a validation record whose hashes differ in ``bits`` bits."""

    train: tuple[str, int]  # (shard, record index)
    val: tuple[str, int]
    bits: int
    paths: tuple[str, str] = ("", "")

    def __str__(self) -> str:
        p, q = (f" ({path})" if path else "" for path in self.paths)
        return (
            f"{self.train[0]}: record {self.train[1]}{p}: near-duplicate image "
            f"({self.bits} of 64 hash bits differ) of {self.val[0]}: record {self.val[1]}{q}, "
            "in training and validation"
        )


@dataclass(frozen=True)
class NearDuplicates:
    """Pairs across the split within ``distance`` bits, and the first few of them."""

    distance: int
    across_splits: int = 0
    hashed: int = 0  # records with a hash (an image Pillow decoded)
    examples: tuple[NearPair, ...] = ()

    def metrics(self) -> dict[str, int]:
        return {
            "across_splits": self.across_splits,
            "distance": self.distance,
            "hashed": self.hashed,
        }


def bands(distance: int) -> list[tuple[int, int]]:
    """``distance + 1`` disjoint (shift, bits) bands covering the 64 bits."""
    count = distance + 1
    edges = [round(64 * i / count) for i in range(count + 1)]
    return [(lo, hi - lo) for lo, hi in itertools.pairwise(edges)]


def candidate_pairs(train: np.ndarray, val: np.ndarray, distance: int) -> Iterator[np.ndarray]:
    """Arrays of (train index, val index, bits) rows within ``distance``, each pair once."""
    cut = bands(distance)
    for b, (shift, width) in enumerate(cut):
        mask = np.uint64((1 << width) - 1)
        t_keys = (train >> np.uint64(shift)) & mask
        v_keys = (val >> np.uint64(shift)) & mask
        order = np.argsort(v_keys, kind="stable")
        sorted_keys = v_keys[order]
        lo = np.searchsorted(sorted_keys, t_keys, "left")
        hi = np.searchsorted(sorted_keys, t_keys, "right")
        for t_idx, v_idx in _expand(lo, hi, order):
            x = train[t_idx] ^ val[v_idx]
            bits = np.bitwise_count(x)
            keep = bits <= distance
            for s, w in cut[:b]:  # counted in an earlier band already
                keep &= ((x >> np.uint64(s)) & np.uint64((1 << w) - 1)) != 0
            yield np.stack([t_idx[keep], v_idx[keep], bits[keep].astype(np.int64)], axis=1)


def _expand(
    lo: np.ndarray, hi: np.ndarray, order: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Every (train, val) pair sharing a band value, at most about ``_CHUNK`` at a time."""
    counts = hi - lo
    ends = np.cumsum(counts)
    start = 0
    while start < len(lo):
        base = ends[start - 1] if start else 0
        stop = max(int(np.searchsorted(ends, base + _CHUNK, "right")), start + 1)
        c = counts[start:stop]
        total = int(c.sum())
        if total:
            t_idx = np.repeat(np.arange(start, stop), c)
            first = np.repeat(lo[start:stop] - np.cumsum(c) + c, c)
            v_idx = order[first + np.arange(total)]
            yield t_idx, v_idx
        start = stop


def find(
    rows: Mapping[str, np.ndarray],
    val: Collection[str],
    distance: int,
    *,
    limit: int = EXAMPLES,
) -> NearDuplicates:
    """Near-duplicate pairs across the split among ``rows`` (each shard's phash rows, by name).

    Shards named in ``val`` are the validation side, the rest training.
    """
    sides: dict[bool, tuple[list[np.ndarray], list[tuple[str, np.ndarray]]]] = {
        False: ([], []),
        True: ([], []),
    }
    for name, shard in rows.items():
        hashes, where = sides[name in val]
        ok = np.flatnonzero(shard["ok"])
        hashes.append(shard["hash"][ok])
        where.append((name, ok))
    train, val_hashes = (
        np.concatenate(sides[s][0] or [np.zeros(0, np.uint64)]) for s in (False, True)
    )
    hashed = len(train) + len(val_hashes)
    if not len(train) or not len(val_hashes):
        return NearDuplicates(distance, 0, hashed)
    count, closest = 0, np.zeros((0, 3), dtype=np.int64)
    for found in candidate_pairs(train, val_hashes, distance):
        count += len(found)
        closest = _closest(np.concatenate([closest, found]), limit)
    examples = tuple(
        NearPair(_record(sides[False][1], t), _record(sides[True][1], v), bits)
        for t, v, bits in closest.tolist()
    )
    return NearDuplicates(distance, count, hashed, examples)


def _closest(pairs: np.ndarray, limit: int) -> np.ndarray:
    """The ``limit`` rows of (train, val, bits) with the fewest bits, then by position."""
    order = np.lexsort((pairs[:, 1], pairs[:, 0], pairs[:, 2]))
    return pairs[order[:limit]]


def _record(where: list[tuple[str, np.ndarray]], k: int) -> tuple[str, int]:
    """The (shard, record index) of the ``k``-th hashed record of one side."""
    for name, ok in where:
        if k < len(ok):
            return name, int(ok[k])
        k -= len(ok)
    raise IndexError(k)


def with_paths(
    found: NearDuplicates, fs: Any, version: str, shards: Mapping[str, Any]
) -> NearDuplicates:
    """``found`` with its examples' paths, read from the shards' member lists."""
    lists: dict[str, list[Any]] = {}

    def path(at: tuple[str, int]) -> str:
        name, i = at
        if name not in lists:
            try:
                lists[name] = members.load(fs, version, shards[name], trusted=True)
            except (InputError, OSError):  # a damaged list is validate's problem to report
                lists[name] = []
        rows = lists[name]
        return str(rows[i][0]) if i < len(rows) else ""

    examples = tuple(
        NearPair(p.train, p.val, p.bits, (path(p.train), path(p.val))) for p in found.examples
    )
    return NearDuplicates(found.distance, found.across_splits, found.hashed, examples)
