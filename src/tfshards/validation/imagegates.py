"""Image statistics per side of the split: DVC metrics and plots, and the gates over them.

The writer stores them per split bucket in ``imagestats.json``
(:mod:`tfshards.shardset.imagestats`); a side is the merge of its buckets,
the sides those of this validation's split. The previous version is the one
the writer named as this one's predecessor (``write.previous``; in a
pipeline, the last version): its buckets are copied into this version's file
under ``base`` and sided the same way, so a gate compares like with like even
after that version was pruned. A version written with no predecessor, or
from one without statistics, has none: the gates that compare stay quiet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import jsonfile, storage
from tfshards.errors import InputError
from tfshards.shardset import layout
from tfshards.shardset.histogram import bin_bounds, bin_of
from tfshards.shardset.imagestats import ImageStats, merged, read_version
from tfshards.shardset.manifest import Manifest
from tfshards.shardset.split import Split
from tfshards.validation.imagelimits import ImageGates
from tfshards.validation.rules import Problem

SIDES = ("train", "val")


@dataclass(frozen=True)
class SideStats:
    """Each side's image statistics; the previous version's, sided the same way, if known."""

    sides: Mapping[str, ImageStats]
    base: Mapping[str, ImageStats] | None = None
    base_fingerprint: str = ""


def load(manifest: Manifest, part: Split, **options: Any) -> SideStats | None:
    """The version's statistics per side of ``part``; None when it has none."""
    try:
        found = read_version(manifest.directory, **options)
    except OSError as exc:
        where = storage.join(manifest.directory, layout.IMAGESTATS_NAME)
        raise InputError(f"{where}: cannot read: {exc.strerror or exc}", path=where) from None
    if found is None:
        return None
    val = {s.bucket for s in part.val}

    def sided(buckets: Mapping[int, ImageStats]) -> dict[str, ImageStats]:
        return {
            "train": merged(s for b, s in sorted(buckets.items()) if b not in val),
            "val": merged(s for b, s in sorted(buckets.items()) if b in val),
        }

    base = sided(found.base) if found.base is not None else None
    return SideStats(sided(found.buckets), base, found.base_fingerprint)


def metrics(stats: SideStats) -> dict[str, Any]:
    """A few numbers per side for ``dvc metrics`` / ``dvc exp show`` (the image count is
    the side's records, in validate's metrics)."""
    out = {}
    for side in SIDES:
        s = stats.sides[side]
        out[side] = {
            "non_rgb_share": round(s.non_rgb / s.images, 6) if s.images else 0.0,
            "exif_rotated": s.rotated,
            "median_width": s.width.median(),
            "median_height": s.height.median(),
            "formats": dict(sorted(s.formats.items())),
        }
    return out


def plot_rows(s: ImageStats) -> list[dict[str, int]]:
    """The width histogram's non-empty bins: ``{"width_px": low, "images": n}`` rows."""
    return [{"images": n, "width_px": bin_bounds(b)[0]} for b, n in enumerate(s.width.counts) if n]


def outputs(
    stats: SideStats | None, metrics_url: str | None, plots: str | None
) -> list[jsonfile.Output]:
    """The metrics file and ``plots/train.json``, ``plots/val.json`` (empty: no stats), with
    what such a file holds when empty (``like``): only then can a user's file be told."""
    out = []
    if metrics_url is not None:
        doc = metrics(stats) if stats is not None else {}
        like: dict[str, Any] = {side: {} for side in SIDES}
        out.append(jsonfile.Output(doc, metrics_url, like=like, ordered=True))
    for side in SIDES if plots is not None else ():
        assert plots is not None
        rows = plot_rows(stats.sides[side]) if stats is not None else []
        url = storage.join(plots, f"{side}.json")
        out.append(jsonfile.Output(rows, url, like=[{"images": 0, "width_px": 0}]))
    return out


def check(stats: SideStats, gates: ImageGates) -> list[Problem]:
    """One problem per gate that fails, naming up to three example files."""
    found = [
        _non_rgb(stats, gates.max_non_rgb_share),
        _not_allowed(stats, gates.allowed_formats),
        _new_format(stats) if gates.fail_on_new_format else None,
        _width_moved(stats, gates.max_median_width_change),
    ]
    return [Problem(layout.IMAGESTATS_NAME, what) for what in found if what is not None]


def _examples(paths: Sequence[str]) -> str:
    return "; e.g. " + ", ".join(sorted(paths)[:3]) if paths else ""


def _non_rgb(stats: SideStats, limit: float) -> str | None:
    over = [
        (side, s) for side, s in stats.sides.items() if s.images and s.non_rgb / s.images > limit
    ]
    if not over:
        return None
    said = ", ".join(
        f"{side} {100 * s.non_rgb / s.images:.1f}% ({s.non_rgb} of {s.images})" for side, s in over
    )
    paths = sorted({p for _, s in over for p in s.non_rgb_examples()})
    return (
        f"images with other than 3 channels: {said}, above max_non_rgb_share {limit:g}"
        + _examples(paths)
    )


def _not_allowed(stats: SideStats, allowed: tuple[str, ...]) -> str | None:
    if not allowed:
        return None
    bad = {
        (fmt, side): s.format_examples.get(fmt, [])
        for side, s in stats.sides.items()
        for fmt in s.formats
        if fmt not in allowed
    }
    if not bad:
        return None
    said = ", ".join(f"{fmt} on {side}" for fmt, side in sorted(bad))
    paths = [p for found in bad.values() for _, p in found]
    return f"image formats not in allowed_formats {','.join(allowed)}: {said}" + _examples(paths)


def _new_format(stats: SideStats) -> str | None:
    if stats.base is None:
        return None
    new = {
        (fmt, side): s.format_examples.get(fmt, [])
        for side, s in stats.sides.items()
        if stats.base[side].images
        for fmt in s.formats
        if fmt not in stats.base[side].formats
    }
    if not new:
        return None
    said = ", ".join(f"{fmt} on {side}" for fmt, side in sorted(new))
    paths = [p for found in new.values() for _, p in found]
    return f"image formats new since version {stats.base_fingerprint}: {said}" + _examples(paths)


def _width_moved(stats: SideStats, limit: float) -> str | None:
    if not limit or stats.base is None:
        return None
    moved = []
    for side, s in stats.sides.items():
        old = stats.base[side]
        if not (s.width.total and old.width.total):
            continue
        was, now = old.width.median(), s.width.median()
        change = 100 * (now - was) / was
        if abs(change) > limit:
            moved.append((side, s, was, now, change))
    if not moved:
        return None
    said = ", ".join(f"{side} {was} -> {now} px ({c:+.1f}%)" for side, _, was, now, c in moved)
    paths = _near(moved[0][1], moved[0][3], moved[0][2])
    return (
        f"median width moved since version {stats.base_fingerprint}: {said}, more than "
        f"max_median_width_change {limit:g}%" + _examples(paths)
    )


def _near(s: ImageStats, now: int, was: int) -> list[str]:
    """Up to three example paths from the width bins at ``now`` and beyond it, away from
    ``was``: the images that moved the median (those between kept the old widths)."""
    bins = len(s.width.counts)
    here = bin_of(now, bins)
    steps = range(here, bins) if now >= was else range(here, -1, -1)
    paths = [s.width_examples[b][0][1] for b in steps if b in s.width_examples]
    return paths[:3]
