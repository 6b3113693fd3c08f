"""The train option ``mix``: other shard sets trained on beside ``--manifest``, each at a weight.

``mix: a/manifest.json:0.3,b/manifest.json:0.2`` trains on a weighted mix
(:mod:`tfshards.reading.mixing`) of the training sides of ``--manifest`` (the
rest, 0.5) and of those sets, each split as ``--manifest`` is (``val_fraction``,
``split_seed``). Validation reads ``--manifest``'s validation side only, so
``val_*`` measure the same records with and without a mix; the other sets'
validation sides are held out unread. Before training the sets must name the
same labels in the same order, and no training record of one set may be a
file another set validates on (:mod:`tfshards.shardset.crossleaks`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfshards.errors import ConfigError
from tfshards.shardset import crossleaks
from tfshards.shardset import manifest as manifests
from tfshards.shardset.manifest import Manifest
from tfshards.shardset.split import Split, split

Pairs = tuple[tuple[str, float], ...]  # (manifest path or URL, weight) of each mixed set
FORM = "PATH:WEIGHT[,PATH:WEIGHT...] or none"


def parse(text: str) -> Pairs:
    """``PATH:WEIGHT[,PATH:WEIGHT...]`` as pairs (a URL's own ``:`` kept); ``none``: none."""
    if text.strip().lower() in ("", "none"):
        return ()
    pairs = []
    for item in text.split(","):
        path, _, weight = item.strip().rpartition(":")
        try:
            pairs.append((path, float(weight)))
        except ValueError:
            path = ""
        if not path:
            raise ValueError(f"expected {FORM}, found {item.strip()!r}")
    return tuple(pairs)


def check(pairs: Pairs) -> None:
    """Every weight finite and > 0, their sum < 1 (the rest is ``--manifest``'s)."""
    total = sum(w for _, w in pairs)
    if pairs and not (all(math.isfinite(w) and w > 0 for _, w in pairs) and total < 1):
        found = ", ".join(f"{p}:{w:g}" for p, w in pairs)
        raise ConfigError(
            f"mix: expected weights > 0 summing below 1 (the rest is --manifest's), "
            f"found {found} (sum {total:g})",
            option="mix",
        )


@dataclass(frozen=True)
class Mix:
    """The sets a run trains on: ``--manifest``'s first, then the mix's, each split."""

    names: tuple[str, ...]
    manifests: tuple[Manifest, ...]
    parts: tuple[Split, ...]
    weights: tuple[float, ...]

    def sources(self) -> list[Any]:
        """The training side of every set as a :class:`tfshards.reading.mixing.Source`."""
        from tfshards.reading.mixing import Source

        return [
            Source(p.train, m, w)
            for p, m, w in zip(self.parts, self.manifests, self.weights, strict=True)
        ]

    def metric(self) -> str:
        """``PATH:WEIGHT,...`` of every set, ``--manifest`` first: the ``mix_sources`` metric."""
        return ",".join(f"{n}:{w:.4g}" for n, w in zip(self.names, self.weights, strict=True))

    def fingerprints(self) -> list[str]:
        return [m.fingerprint for m in self.manifests]


def load_sets(
    name: str, manifest: Manifest, parts: Split, mix: Pairs, fraction: float, seed: int
) -> Mix | None:
    """``--manifest`` (``name``, loaded and split) and the sets of ``mix`` split the same way
    (None without a mix); ConfigError (one line) when labels differ or a set trains on a
    file another set validates on."""
    if not mix:
        return None
    loaded = [manifests.load(path) for path, _ in mix]
    for (path, _), other in zip(mix, loaded, strict=True):
        _same_labels(path, other.labels, manifest.labels)
    found = Mix(
        (name, *(p for p, _ in mix)),
        (manifest, *loaded),
        (parts, *(split(m, fraction, seed) for m in loaded)),
        (1.0 - sum(w for _, w in mix), *(w for _, w in mix)),
    )
    _no_cross_leaks(found)
    return found


def _same_labels(path: str, labels: Sequence[str], expected: Sequence[str]) -> None:
    if list(labels) == list(expected):
        return
    extra, missing = sorted(set(labels) - set(expected)), sorted(set(expected) - set(labels))
    how = f"has {extra} and lacks {missing}" if extra or missing else "orders them otherwise"
    raise ConfigError(
        f"mix: expected the labels of --manifest {list(expected)}, found {path} {how}",
        option="mix",
    )


def _no_cross_leaks(mix: Mix) -> None:
    """A file one set trains on that another validates on fails the run, in one line."""
    sides = list(zip(mix.manifests, mix.parts, strict=True))
    leaks = crossleaks.find([(m, p.train) for m, p in sides], [(m, p.val) for m, p in sides])
    if leaks.count:
        first, named = leaks.examples[0], mix.names
        raise ConfigError(
            f"mix: expected no record of one set's training side in another's validation "
            f"side, found {leaks.count}: {named[first.train_set]} trains on "
            f"{first.train_path}, which {named[first.val_set]} validates on as {first.val_path}",
            option="mix",
        )
