"""The record order of a training epoch: a pure function of the manifest, seed, epoch and worker.

Each shard is cut into *units* of about ``UNIT_BYTES`` of consecutive records,
from its manifest entry alone (records and bytes; a gzip/zlib shard, which
cannot be read from an offset without inflating what comes before, is one
unit, so a window holds at least one inflated shard: write compressed sets with
shards near the window size). Epoch ``e`` permutes all units (seeded by
``seed, e``), groups consecutive units of that order into *windows* of about ``window_bytes``, and
permutes the records within each window (seeded by ``seed, e, window``). Its
global order is cut into ``count`` equal blocks, one per worker: worker ``i``
reads records ``[i * n, (i + 1) * n)`` of it with ``n = records // count``;
the last ``records % count`` of every epoch go to no worker (:attr:`dropped`).

A position (epoch, records consumed) maps to (window, offset) through the
windows' prefix sums, so a resumed reader starts at that window: it never
replays the epoch. NumPy only (``default_rng`` seeded with a list: PCG64 via
SeedSequence, the same stream on every platform).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from tfshards.errors import ConfigError

UNIT_BYTES = 1 << 20  # as the gate's read chunks (tfshards.reading.gate.CHUNK_BYTES)
_SEED_MASK = (1 << 63) - 1
# An epoch or record number past this is no real stream's (2**53 records of one byte are
# 9 PB); TensorFlow's int64 counters and NumPy's take it whole.
_LARGEST_BITS = 53


def is_whole(value: object) -> bool:
    """An integer (numpy's too), never a bool: what the reading options count with."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    """A whole number in ``[0, 2**_LARGEST_BITS)``."""
    return is_whole(value) and 0 <= int(cast(numbers.Integral, value)) < 1 << _LARGEST_BITS


@dataclass(frozen=True)
class Position:
    """Where a worker's training stream stands: ``record`` records of epoch ``epoch`` read."""

    epoch: int = 0
    record: int = 0

    def __post_init__(self) -> None:
        fields = (self.epoch, self.record)
        if not all(_is_count(v) for v in fields):
            raise ConfigError(
                f"start must be (epoch, record), two integers in [0, 2**{_LARGEST_BITS}), "
                f"got {fields!r}"
            )
        object.__setattr__(self, "epoch", int(self.epoch))
        object.__setattr__(self, "record", int(self.record))

    @classmethod
    def of(cls, start: Position | Sequence[int] | None) -> Position:
        """``start`` as a position: a Position, an ``(epoch, record)`` pair, or None (0, 0)."""
        if start is None:
            return cls()
        if isinstance(start, Position):
            return start
        if isinstance(start, (str, bytes)) or not isinstance(start, Sequence) or len(start) != 2:
            raise ConfigError(f"start must be (epoch, record), got {start!r}")
        return cls(*start)

    @classmethod
    def after(cls, records: int, per_epoch: int) -> Position:
        """The position after ``records`` records of a stream of ``per_epoch``-record epochs."""
        if per_epoch < 1:
            return cls(0, 0)
        epoch, record = divmod(records, per_epoch)
        return cls(epoch, record)


@dataclass(frozen=True)
class Window:
    """One window of an epoch: its units as ``(shard, first record, records)`` rows, in
    order, and the permutation of its records (the i-th record read is ``perm[i]``)."""

    pieces: np.ndarray
    perm: np.ndarray


class EpochOrder:
    """The seekable record order of every training epoch of a list of shards.

    Args:
        records: records of each shard (manifest entries, in the order given).
        nbytes: bytes of each shard (the stored size).
        seed: seeds every permutation.
        window_bytes: about how many bytes of records are permuted together.
        whole_shards: every shard is one unit (gzip/zlib shards).
        worker: ``(index, count)``: this worker's block of each epoch.
    """

    def __init__(
        self,
        records: Sequence[int],
        nbytes: Sequence[int],
        *,
        seed: int,
        window_bytes: int,
        whole_shards: bool = False,
        worker: tuple[int, int] = (0, 1),
    ) -> None:
        index, count = worker
        if count < 1 or not 0 <= index < count:
            raise ConfigError(
                f"worker must be (index, count) with 0 <= index < count, got {worker}"
            )
        self.seed = int(seed) & _SEED_MASK
        self.window_bytes = max(1, int(window_bytes))
        self.worker = (int(index), int(count))
        self.total = int(sum(records))
        self.per_worker = self.total // count
        self.dropped = self.total - self.per_worker * count
        self._units, self._unit_bytes = _units(records, nbytes, whole_shards)
        self._cached: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    @property
    def units(self) -> int:
        return len(self._units)

    def steps(self, batch_size: int) -> int:
        """Whole batches in one worker's epoch."""
        return self.per_worker // batch_size

    def slices(self, epoch: int, record: int = 0) -> np.ndarray:
        """This worker's reads of epoch ``epoch`` from its ``record``-th record on.

        int64 rows ``(window, skip, take)``: take ``take`` records of the
        window's permuted records after the first ``skip``.
        """
        index, _ = self.worker
        lo = index * self.per_worker + min(record, self.per_worker)
        hi = (index + 1) * self.per_worker
        if lo >= hi:
            return np.zeros((0, 3), np.int64)
        _, _, ends = self._plan(epoch)
        starts = np.concatenate([[0], ends[:-1]])
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(ends, hi, side="left"))
        windows = np.arange(first, last + 1, dtype=np.int64)
        skip = np.maximum(lo - starts[windows], 0)
        take = np.minimum(ends[windows], hi) - starts[windows] - skip
        return np.stack([windows, skip, take], axis=1).astype(np.int64)

    def window(self, epoch: int, window: int) -> Window:
        """The units of window ``window`` of epoch ``epoch`` and its record permutation."""
        order, bounds, ends = self._plan(epoch)
        chosen = order[bounds[window] : bounds[window + 1]]
        size = int(ends[window] - (ends[window - 1] if window else 0))
        rng = np.random.default_rng([self.seed, int(epoch), int(window), 1])
        return Window(self._units[chosen], rng.permutation(size))

    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The epoch's unit order, where each window starts in it (and ends), and the
        windows' cumulative record counts."""
        cached = self._cached
        if cached is not None and cached[0] == epoch:
            return cached[1]
        order = np.random.default_rng([self.seed, int(epoch)]).permutation(len(self._units))
        sizes = self._unit_bytes[order]
        begins = np.cumsum(sizes) - sizes  # where each unit starts, in bytes of the epoch
        ids = begins // self.window_bytes
        cuts = np.flatnonzero(np.diff(ids)) + 1
        bounds = np.concatenate([[0], cuts, [len(order)]]).astype(np.int64)
        counts = np.add.reduceat(self._units[order, 2], bounds[:-1]) if len(order) else bounds[:0]
        plan = (order, bounds, np.cumsum(counts).astype(np.int64))
        self._cached = (epoch, plan)
        return plan


def _units(
    records: Sequence[int], nbytes: Sequence[int], whole_shards: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``(shard, first record, records)`` of every unit, and each unit's bytes (estimated
    from its shard's mean record size)."""
    rows: list[np.ndarray] = []
    for shard, (count, size) in enumerate(zip(records, nbytes, strict=True)):
        if count <= 0:
            continue
        per = count if whole_shards else max(1, min(count, UNIT_BYTES * count // max(1, size)))
        firsts = np.arange(0, count, per, dtype=np.int64)
        lengths = np.minimum(per, count - firsts)
        rows.append(np.stack([np.full_like(firsts, shard), firsts, lengths], axis=1))
    units = np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)
    sizes = np.asarray(nbytes, np.float64)
    counts = np.maximum(np.asarray(records, np.float64), 1)
    unit_bytes = np.ceil(units[:, 2] * sizes[units[:, 0]] / counts[units[:, 0]]).astype(np.int64)
    return units, np.maximum(unit_bytes, 1)
