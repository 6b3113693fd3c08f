"""Seeded train/validation splits by whole file, of shard sets and of raw-file listings."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfshards import jsonfile
from tfshards.errors import ConfigError
from tfshards.shardset.buckets import DEFAULT_BUCKETS
from tfshards.shardset.manifest import Manifest, ShardInfo, expect

SPLIT_TOLERANCE = 0.1  # warn when the effective val fraction is off by more than 10% of the ask
# Warn when a label's share of validation records differs from its share of training
# records by more than 5 percentage points AND by more than sampling explains
# (BALANCE_SIGMAS standard errors of the difference of the two shares). With 10
# balanced labels and ~340 validation records (the digits demo), sampling alone moves
# a share by ~1.6 points (one sigma); on 300 images of 3 labels with 60 held out, by
# ~6.8 points, so a 5-point rule alone warned on nearly every small set.
BALANCE_TOLERANCE = 0.05
BALANCE_SIGMAS = 3.0
# A label missing from validation is worth a warning only when it was expected there
# at least this many times (its chance to be missing by luck is then under e^-5, 0.7%).
MISSING_EXPECTED = 5.0


class SplitWarning(UserWarning):
    """The shards are too few to split at the asked fraction; the effective one is reported."""


@dataclass(frozen=True)
class Split:
    """Train and validation shards, chosen by :func:`split`.

    Attributes:
        train: training shards, sorted by name.
        val: validation shards, sorted by name (empty when ``val_fraction`` is 0).
        seed: the seed of the shuffle that chose them.
        val_fraction: the fraction asked for.
        effective_val_fraction: ``val_records / (train_records + val_records)``.
        fingerprint: the manifest's fingerprint (which shard set was split).
    """

    train: tuple[ShardInfo, ...]
    val: tuple[ShardInfo, ...]
    seed: int
    val_fraction: float
    effective_val_fraction: float
    fingerprint: str = ""

    @property
    def train_records(self) -> int:
        return sum(s.records for s in self.train)

    @property
    def val_records(self) -> int:
        return sum(s.records for s in self.val)

    def to_json(self) -> bytes:
        """Which shard went where, and the counts: a small document for lineage."""
        doc = {
            "effective_val_fraction": round(self.effective_val_fraction, 6),
            "fingerprint": self.fingerprint,
            "seed": self.seed,
            "train": {"records": self.train_records, "shards": [s.name for s in self.train]},
            "val": {"records": self.val_records, "shards": [s.name for s in self.val]},
            "val_fraction": self.val_fraction,
            "version": 1,
        }
        return jsonfile.encode(doc)


def split(manifest: Manifest, val_fraction: float, seed: int = 0) -> Split:
    """Split the shard files of ``manifest`` into train and validation sets.

    A pure function of ``(manifest, val_fraction, seed)``. In a bucketed set
    (:mod:`tfshards.shardset.buckets`) every bucket id of the lineage, empty or
    not, is shuffled with ``random.Random(seed)`` (the same permutation on
    every CPython and machine) and the first ``round(val_fraction * count)``
    go to validation: the count never depends on how many records each bucket
    holds, so a record keeps its side in every later version of the set (its
    bucket is a hash of its own key). Only a set too small to fill its chosen
    buckets borrows the next ones (with a warning: those records may change
    side as the set grows). Validation gets every shard of its buckets: whole
    files, so the two sets never share a record and each reads sequentially.
    A set written before buckets is split by shard file, as many shuffled
    shards as bring the record count closest to ``val_fraction``.

    Args:
        manifest: the shard set.
        val_fraction: share of records for validation, in ``[0, 1)``. When it
            is above 0, validation gets at least one shard and training keeps
            at least one.
        seed: seed of the shuffle.

    Raises:
        ConfigError: ``val_fraction`` is out of range, or above 0 with a single shard.

    Warns:
        SplitWarning: the effective fraction (in records) is off by more than
            10% of the one asked for; it is also in ``Split.effective_val_fraction``.
    """
    manifest = expect(manifest)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)):
        raise ConfigError(f"val_fraction must be a number in [0, 1), got {val_fraction!r}")
    shards = manifest.shards
    if shards and all(s.bucket is not None for s in shards):  # whole buckets, then their shards
        highest = max(s.bucket or 0 for s in shards)
        count = max(int(manifest.params.get("buckets") or 0), highest + 1)
        chosen, effective = _val_buckets(shards, count, val_fraction, seed)
        val = [i for i, s in enumerate(shards) if s.bucket in chosen]
        train = [i for i, s in enumerate(shards) if s.bucket not in chosen]
    else:
        names = [s.name for s in shards]
        weights = [s.records for s in shards]
        train, val, effective = choose_val(names, weights, val_fraction, seed, unit="shard")
    return Split(
        train=tuple(manifest.shards[i] for i in train),
        val=tuple(manifest.shards[i] for i in val),
        seed=seed,
        val_fraction=val_fraction,
        effective_val_fraction=effective,
        fingerprint=manifest.fingerprint,
    )


def _val_buckets(
    shards: Sequence[ShardInfo], count: int, val_fraction: float, seed: int
) -> tuple[set[int], float]:
    """The validation buckets of :func:`split` and the effective fraction in records."""
    if not 0.0 <= val_fraction < 1.0 or math.isnan(val_fraction):
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction}")
    held = [0] * count
    for shard in shards:
        held[shard.bucket or 0] += shard.records
    total = sum(held)
    if val_fraction == 0.0:
        return set(), 0.0
    filled = sum(1 for n in held if n)
    if filled < 2:
        raise ConfigError(
            f"val_fraction {val_fraction}: a split needs records in at least 2 split buckets "
            f"(one for training, one for validation), found {filled} of {count}; write more "
            "files or use val_fraction 0"
        )
    order = list(range(count))
    random.Random(seed).shuffle(order)
    k = min(count - 1, max(1, math.floor(val_fraction * count + 0.5)))
    asked = k
    while not any(held[b] for b in order[:k]):  # borrow the next buckets: validation holds one
        k += 1
    while not any(held[b] for b in order[k:]):  # give back the last: training holds one
        k -= 1
    val_records = sum(held[b] for b in order[:k])
    effective = val_records / total
    if k != asked:
        warnings.warn(
            f"val_fraction {val_fraction}: {total} records fill {filled} of the {count} split "
            f"buckets, too few for the {asked} validation buckets the seed picks (one side "
            f"would be empty); validation takes {k} ({val_records} records, an effective "
            f"fraction of {effective:.4f}), and the records of the {abs(k - asked)} buckets "
            "moved across may change side as the set grows",
            SplitWarning,
            stacklevel=3,
        )
    elif _off(effective, val_fraction, k, count, total):
        warnings.warn(
            f"val_fraction {val_fraction}: the {k} validation buckets of {count} hold "
            f"{val_records} of {total} records, an effective fraction of {effective:.4f}; "
            + (
                "more files fill the buckets more evenly"
                if count >= DEFAULT_BUCKETS
                else f"{count} buckets split in steps of 1/{count}: write.previous none "
                "(--previous none) starts a lineage with write.buckets"
            ),
            SplitWarning,
            stacklevel=3,
        )
    return set(order[:k]), effective


def _off(effective: float, asked: float, k: int, count: int, total: int) -> bool:
    """Whether ``k`` validation buckets of ``count`` holding ``effective`` of ``total``
    records is worth a warning.

    Whole buckets split in steps of 1/count: within half a step of the fraction asked is
    the granularity the bucket count chose. Records fill the buckets unevenly by chance:
    within 3 standard errors of ``k / count`` is sampling (a 200-file set drew 31 of 200,
    0.155, where 3 of 16 buckets give 0.1875, and warned on every run). Neither is worth
    a line; a share further off than both is.
    """
    step = k / count
    noise = BALANCE_SIGMAS * math.sqrt(step * (1 - step) / total)
    if abs(step - asked) > max(SPLIT_TOLERANCE * asked, 0.5 / count):
        return True  # the bucket count itself cannot come close
    return abs(effective - asked) > max(SPLIT_TOLERANCE * asked, 0.5 / count) and (
        abs(effective - step) > noise
    )


def choose_val(
    names: Sequence[str],
    weights: Sequence[int],
    val_fraction: float,
    seed: int,
    *,
    unit: str,
    counted: str = "records",
) -> tuple[list[int], list[int], float]:
    """The split rule shared by shards and files: ``(train, val, effective fraction)``.

    ``train`` and ``val`` are indices into ``names``, each in name order;
    ``weights`` (``counted`` units per name) measure the fraction.
    """
    if not 0.0 <= val_fraction < 1.0 or math.isnan(val_fraction):
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n = len(names)
    if n == 0:
        raise ConfigError(f"nothing to split: no {unit}s")
    order = sorted(range(n), key=lambda i: names[i])
    if val_fraction == 0.0:
        return order, [], 0.0
    if n < 2:
        raise ConfigError(
            f"val_fraction {val_fraction}: a split needs at least 2 {unit}s (one for "
            f"training, one for validation), found {n}; write more shards or use val_fraction 0"
        )
    random.Random(seed).shuffle(order)
    total = sum(weights)
    target = val_fraction * total
    best_k, best_gap, cumulative = 1, math.inf, 0
    for k in range(1, n):  # k shards go to validation; training keeps at least one
        cumulative += weights[order[k - 1]]
        gap = abs(cumulative - target)
        if gap < best_gap:
            best_k, best_gap = k, gap
    val = sorted(order[:best_k], key=lambda i: names[i])
    train = sorted(order[best_k:], key=lambda i: names[i])
    val_weight = sum(weights[i] for i in val)
    effective = val_weight / total if total else best_k / n
    if abs(effective - val_fraction) > SPLIT_TOLERANCE * val_fraction:
        warnings.warn(
            f"val_fraction {val_fraction}: {n} {unit}s split at best as {len(val)} for "
            f"validation ({val_weight} of {total} {counted}), an effective fraction of "
            f"{effective:.4f}; more {unit}s give a closer split",
            SplitWarning,
            stacklevel=3,
        )
    return train, val, effective


def label_counts(
    split: Split, per_shard: Mapping[str, Sequence[int]], labels: Sequence[str]
) -> dict[str, dict[str, int]]:
    """Records per label on each side of ``split``: ``{"train": {label: n}, "val": {...}}``.

    ``per_shard`` maps a shard name to its records per label index (as a
    validator counts them); a shard it does not name counts as empty.
    """

    def side(shards: Sequence[ShardInfo]) -> dict[str, int]:
        totals = [0] * len(labels)
        for shard in shards:
            for i, n in enumerate(per_shard.get(shard.name, ())):
                totals[i] += n
        return dict(zip(labels, totals, strict=True))

    return {"train": side(split.train), "val": side(split.val)}


def balance_warnings(
    counts: Mapping[str, Mapping[str, int]], tolerance: float = BALANCE_TOLERANCE
) -> list[str]:
    """One line per label missing from training (it has validation records: the model
    never sees it), missing from validation, or whose share there is off train's.

    A share is the label's records over the side's records; "off" means more
    than ``tolerance`` apart (0.05: five percentage points) and more than
    :data:`BALANCE_SIGMAS` standard errors apart, so sampling noise in a small
    validation side does not warn. A missing label warns when it was expected
    at least :data:`MISSING_EXPECTED` times. Nothing when validation is empty
    (``val_fraction`` 0).
    """
    train, val = counts["train"], counts["val"]
    train_total, val_total = sum(train.values()), sum(val.values())
    if not val_total or not train_total:
        return []
    out = []
    for label, n in train.items():
        v = val.get(label, 0)
        ours, theirs = v / val_total, n / train_total
        if n == 0 and v:
            out.append(
                f"label {label!r}: missing from training ({v} validation "
                f"record{'' if v == 1 else 's'}): the model "
                "never sees it, so it scores none of them right (its files or groups all fall "
                "on the validation side)"
            )
            continue
        if v == 0:
            if theirs * val_total >= MISSING_EXPECTED:
                out.append(f"label {label!r}: missing from validation ({n} training records)")
            continue
        pooled = (n + v) / (train_total + val_total)
        noise = BALANCE_SIGMAS * math.sqrt(
            pooled * (1 - pooled) * (1 / val_total + 1 / train_total)
        )
        if abs(ours - theirs) > max(tolerance, noise):
            out.append(
                f"label {label!r}: {ours:.1%} of validation records but {theirs:.1%} of "
                f"training records (more than {max(tolerance, noise):.1%} apart: "
                f"{tolerance:.0%} and {BALANCE_SIGMAS:g} standard errors)"
            )
    return out
