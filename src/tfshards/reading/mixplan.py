"""Which source each record of a weighted mix comes from: a pure, seekable schedule.

A mixed epoch of ``S`` records takes exactly ``counts[i]`` records from source
``i``: ``w_i * S`` rounded by largest remainder (each floored, then one more to
the largest fractional parts, ties to the lower index), so the counts sum to
``S`` and each is within 1 of ``w_i * S``. Mixed epoch ``e`` is a seeded
permutation of that multiset of source ids (``default_rng([seed, e, 0, 2])``).
Each source is its own continuous stream across mixed epochs: before mixed
position ``(E, r)`` source ``i`` has read ``E * counts[i]`` records plus its ids
among the first ``r`` of epoch ``E``, which is its own ``Position.after(that,
its records per epoch)``. NumPy only, like :mod:`tfshards.reading.epochorder`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from tfshards.errors import ConfigError
from tfshards.reading.epochorder import Position, is_whole

_SEED_MASK = (1 << 63) - 1


class MixPlan:
    """The source schedule of every mixed epoch.

    Args:
        sizes: records of one epoch of each source (per worker).
        weights: each source's share; positive, normalized to sum to 1.
        seed: seeds the schedule and, through :meth:`source_seed`, each source's order.
        epoch_size: records per mixed epoch; None: the largest at which no
            source gives more records than one of its own epochs
            (about ``min(sizes[i] / w_i)``).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Sequence[float],
        *,
        seed: int,
        epoch_size: int | None = None,
    ) -> None:
        if len(sizes) != len(weights) or not sizes:
            raise ConfigError(f"need one weight per source, got {len(weights)} for {len(sizes)}")
        if not all(_is_weight(w) for w in weights):
            raise ConfigError(f"weights must be finite numbers > 0, got {list(weights)}")
        if min(sizes) < 1:
            raise ConfigError(f"every source needs >= 1 record per epoch, got {list(sizes)}")
        largest = max(float(w) for w in weights)  # scaled first: 1e308 + 1e308 is inf
        scaled = [float(w) / largest for w in weights]
        total = sum(scaled)
        self.weights = np.asarray([w / total for w in scaled], np.float64)
        self.sizes = np.asarray(sizes, np.int64)
        self.seed = int(seed) & _SEED_MASK
        if epoch_size is None:
            epoch_size = self._no_repeat_size()
        if not is_whole(epoch_size):
            raise ConfigError(f"epoch_size must be an integer >= 1, got {epoch_size!r}")
        if epoch_size < 1:
            raise ConfigError(f"epoch_size must be >= 1, got {epoch_size}")
        self.epoch_size = int(epoch_size)
        self.counts = largest_remainder(self.weights, self.epoch_size)
        self._cached: tuple[int, np.ndarray] | None = None

    def source_seed(self, source: int) -> int:
        """The seed of source ``source``'s own epoch order."""
        state = np.random.SeedSequence([self.seed, int(source)]).generate_state(1, np.uint64)
        return int(state[0]) & _SEED_MASK

    def steps(self, batch_size: int) -> int:
        """Whole batches in one mixed epoch."""
        return self.epoch_size // batch_size

    def schedule(self, epoch: int) -> np.ndarray:
        """The source id (int64) of every record of mixed epoch ``epoch``, in order."""
        cached = self._cached
        if cached is not None and cached[0] == epoch:
            return cached[1]
        ids = np.repeat(np.arange(len(self.counts), dtype=np.int64), self.counts)
        order = np.random.default_rng([self.seed, int(epoch), 0, 2]).permutation(ids)
        self._cached = (int(epoch), order)
        return order

    def position(self, start: Position | tuple[int, int] | None) -> Position:
        """``start`` as a position of the mixed stream (a record past the epoch carried over)."""
        start = Position.of(start)
        return Position.after(start.epoch * self.epoch_size + start.record, self.epoch_size)

    def consumed(self, start: Position) -> list[int]:
        """Records each source has read before the mixed stream's position ``start``."""
        ahead = np.bincount(self.schedule(start.epoch)[: start.record], minlength=len(self.counts))
        return [int(c) * start.epoch + int(a) for c, a in zip(self.counts, ahead, strict=True)]

    def source_starts(self, start: Position) -> list[Position]:
        """Where each source's own stream stands at the mixed stream's ``start``."""
        return [
            Position.after(done, int(size))
            for done, size in zip(self.consumed(start), self.sizes, strict=True)
        ]

    def _no_repeat_size(self) -> int:
        """The largest epoch size whose counts fit within one epoch of every source."""
        size = int(min(self.sizes / self.weights)) + 1  # +1: float division may fall short
        while size > 0 and np.any(largest_remainder(self.weights, size) > self.sizes):
            size -= 1
        if size < 1:
            raise ConfigError("no mixed epoch fits the sources; pass epoch_size")
        return size


def _is_weight(value: object) -> bool:
    """A finite real number > 0 (numpy's too; never a bool or a string)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
        and float(value) > 0
    )


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer counts summing to ``total``, each ``weights[i] * total`` floored or raised by 1
    (the largest fractional parts raised; ties to the lower index)."""
    exact = weights * total
    counts: np.ndarray = np.floor(exact).astype(np.int64)
    short = int(total - counts.sum())
    if short > 0:
        raised = np.argsort(-(exact - counts), kind="stable")[:short]
        counts[raised] += 1
    return counts
