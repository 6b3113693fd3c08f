"""Image statistics of records: counts, fixed-bin histograms and example paths, bounded in size.

:class:`ImageStats` holds, for any number of images, counts per format and
per channel count, histograms of width, height and byte size over fixed bins
(exact below 32, then 16 bins per octave: a bin is at most 1/16 = 6.25% wide),
the exact minimum and maximum of each, and :data:`EXAMPLES` example paths per
format and per channel count (one per width bin): those whose SHA-256 is
smallest (:func:`example_rank`), a spread sample that no order of adding changes.
Merging is a sum (and a min/max, and a union of examples), so it gives the
same result in any order: per shard, per bucket, per side.
Its size does not grow with the images it counts; only the digits of the counts do.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfshards import storage
from tfshards.errors import InputError
from tfshards.shardset import layout
from tfshards.shardset.histogram import EXACT, PER_OCTAVE, Histogram, bin_of, bins_of

VERSION = 1
DIM_BITS = 16  # widths and heights from 2**16 px share the last bin (JPEG's limit is 65535)
BYTE_BITS = 36  # byte sizes from 64 GiB share the last bin
EXAMPLES = 3  # paths kept per format and per channel count
UNKNOWN_CHANNELS = "unknown"
RGB_CHANNELS = 3


Example = tuple[int, str]  # (rank, path): kept are the smallest ranks


def example_rank(path: str | bytes) -> int:
    """The first 8 bytes of the path's SHA-256: which examples are kept, in any order of adding."""
    data = path if isinstance(path, bytes) else path.encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def _keep(found: list[Example], example: Example, limit: int = EXAMPLES) -> None:
    """Insert ``example`` into the sorted ``found`` if it is among the ``limit`` smallest."""
    if (len(found) < limit or example < found[-1]) and example not in found:
        bisect.insort(found, example)
        del found[limit:]


@dataclass
class ImageStats:
    """What the headers of some images say, summed; see the module's docstring."""

    images: int = 0
    unknown_size: int = 0  # images whose header tells no width and height
    rotated: int = 0  # images with an EXIF orientation of 2..8 (TensorFlow decodes them as stored)
    formats: dict[str, int] = field(default_factory=dict)
    channels: dict[str, int] = field(default_factory=dict)  # "1", "3", ..., "unknown"
    width: Histogram = field(default_factory=lambda: Histogram.empty(DIM_BITS))
    height: Histogram = field(default_factory=lambda: Histogram.empty(DIM_BITS))
    nbytes: Histogram = field(default_factory=lambda: Histogram.empty(BYTE_BITS))
    format_examples: dict[str, list[Example]] = field(default_factory=dict)
    channel_examples: dict[str, list[Example]] = field(default_factory=dict)
    width_examples: dict[int, list[Example]] = field(default_factory=dict)  # one per bin

    def add(
        self, fmt: str, width: int, height: int, channels: int, size: int, path: str, turn: int = 1
    ) -> None:
        """One image: its header's format, sizes and channels (0: not told), bytes, path,
        EXIF orientation."""
        example = (example_rank(path), path)
        self.images += 1
        self.rotated += turn > 1
        self.formats[fmt] = self.formats.get(fmt, 0) + 1
        _keep(self.format_examples.setdefault(fmt, []), example)
        ch = str(channels) if channels else UNKNOWN_CHANNELS
        self.channels[ch] = self.channels.get(ch, 0) + 1
        _keep(self.channel_examples.setdefault(ch, []), example)
        self.nbytes.add(size)
        if not (width and height):
            self.unknown_size += 1
            return
        self.width.add(width)
        self.height.add(height)
        _keep(self.width_examples.setdefault(bin_of(width, len(self.width.counts)), []), example, 1)

    def add_many(self, formats: Sequence[str], rows: np.ndarray) -> None:
        """:meth:`add` for a batch, but for the examples (:meth:`keep_examples`).

        ``rows``: int64 (format code, width, height, channels, bytes, EXIF
        orientation) each; ``formats`` names each code.
        """
        n = len(rows)
        if not n:
            return
        fmt, width, height, channels, sizes, turns = (rows[:, k] for k in range(6))
        self.images += n
        self.rotated += int(np.count_nonzero(turns > 1))
        for code, count in enumerate(np.bincount(fmt, minlength=len(formats)).tolist()):
            if count:
                self.formats[formats[code]] = self.formats.get(formats[code], 0) + count
        for ch, count in enumerate(np.bincount(channels).tolist()):
            if count:
                key = str(ch) if ch else UNKNOWN_CHANNELS
                self.channels[key] = self.channels.get(key, 0) + count
        self.nbytes.add_many(sizes)
        known = (width > 0) & (height > 0)
        self.unknown_size += n - int(np.count_nonzero(known))
        self.width.add_many(width[known])
        self.height.add_many(height[known])

    def keep_examples(
        self, formats: Sequence[str], rows: np.ndarray, path: Callable[[int], str]
    ) -> None:
        """The examples of ``rows``: :meth:`add_many`'s columns, any two, then
        :func:`example_rank` as uint64 bits. ``path(i)``: row ``i``'s path, asked only
        of rows that may be kept (few, once each group holds its examples).
        """
        ranks = rows[:, 7].view(np.uint64)
        fmt, channels = rows[:, 0], rows[:, 3]
        known = (rows[:, 1] > 0) & (rows[:, 2] > 0)
        wbins = bins_of(rows[:, 1], len(self.width.counts))
        by_format = _bars(self.format_examples, formats, len(formats), EXAMPLES)
        by_channels = _bars(self.channel_examples, None, 256, EXAMPLES)
        by_width = _bars(self.width_examples, None, len(self.width.counts), 1)
        maybe = (ranks < by_format[fmt]) | (ranks < by_channels[np.minimum(channels, 255)])
        maybe |= known & (ranks < by_width[wbins])
        picked = np.flatnonzero(maybe)
        picked = picked[np.argsort(ranks[picked], kind="stable")]
        if len(picked) > 4 * EXAMPLES:  # a group's first rows: only its smallest few may stay
            few = _firsts(fmt[picked], EXAMPLES) | _firsts(channels[picked], EXAMPLES)
            few |= known[picked] & _firsts(wbins[picked], 1)
            picked = picked[few]
        for i in picked.tolist():
            example = (int(ranks[i]), path(i))
            ch = int(channels[i])
            _keep(self.format_examples.setdefault(formats[fmt[i]], []), example)
            key = str(ch) if ch else UNKNOWN_CHANNELS
            _keep(self.channel_examples.setdefault(key, []), example)
            if known[i]:
                _keep(self.width_examples.setdefault(int(wbins[i]), []), example, 1)

    def merge(self, other: ImageStats) -> None:
        self.images += other.images
        self.unknown_size += other.unknown_size
        self.rotated += other.rotated
        for mine, theirs in ((self.formats, other.formats), (self.channels, other.channels)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        self.width.merge(other.width)
        self.height.merge(other.height)
        self.nbytes.merge(other.nbytes)
        for mine_ex, theirs_ex in (
            (self.format_examples, other.format_examples),
            (self.channel_examples, other.channel_examples),
        ):
            for key, found in theirs_ex.items():
                for example in found:
                    _keep(mine_ex.setdefault(key, []), example)
        for b, found in other.width_examples.items():
            for example in found:
                _keep(self.width_examples.setdefault(b, []), example, 1)

    @property
    def non_rgb(self) -> int:
        """Images whose header says other than 3 channels (grey, grey+alpha, RGBA, CMYK)."""
        return sum(n for ch, n in self.channels.items() if ch not in ("3", UNKNOWN_CHANNELS))

    def non_rgb_examples(self) -> list[str]:
        """Up to :data:`EXAMPLES` paths of non-RGB images."""
        found: list[Example] = []
        for ch, examples in self.channel_examples.items():
            if ch not in ("3", UNKNOWN_CHANNELS):
                for example in examples:
                    _keep(found, example)
        return [p for _, p in found]

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes.to_json(),
            "channels": dict(sorted(self.channels.items())),
            "exif_rotated": self.rotated,
            "examples": {
                "channels": _paths(self.channel_examples),
                "formats": _paths(self.format_examples),
                "width_bins": {
                    str(b): found[0][1] for b, found in sorted(self.width_examples.items())
                },
            },
            "formats": dict(sorted(self.formats.items())),
            "height": self.height.to_json(),
            "images": self.images,
            "unknown_size": self.unknown_size,
            "width": self.width.to_json(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ImageStats:
        ex = doc["examples"]
        return cls(
            images=_count(doc["images"]),
            unknown_size=_count(doc["unknown_size"]),
            rotated=_count(doc.get("exif_rotated", 0)),  # absent: written before it was counted
            formats={str(k): _count(v) for k, v in doc["formats"].items()},
            channels={str(k): _count(v) for k, v in doc["channels"].items()},
            width=Histogram.from_json(doc["width"], DIM_BITS),
            height=Histogram.from_json(doc["height"], DIM_BITS),
            nbytes=Histogram.from_json(doc["bytes"], BYTE_BITS),
            format_examples=_examples(ex["formats"]),
            channel_examples=_examples(ex["channels"]),
            width_examples={
                int(k): [(example_rank(v), str(v))] for k, v in ex["width_bins"].items()
            },
        )


def _count(value: Any) -> int:
    """A count as the write stores it: a JSON whole number, not negative (not ``"8"``,
    ``8.9`` or ``true``, which ``int()`` would take)."""
    if type(value) is not int or value < 0:
        raise ValueError(f"a count must be a whole number >= 0, found {value!r}")
    return value


def _paths(examples: Mapping[str, list[Example]]) -> dict[str, list[str]]:
    return {key: [p for _, p in found] for key, found in sorted(examples.items())}


def _examples(doc: Mapping[str, Any]) -> dict[str, list[Example]]:
    return {str(k): sorted((example_rank(p), str(p)) for p in v) for k, v in doc.items()}


def _firsts(groups: np.ndarray, limit: int) -> np.ndarray:
    """Which of ``groups`` (in rank order) are among the first ``limit`` of their group."""
    order = np.argsort(groups, kind="stable")
    ordered = groups[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    runs = np.diff(np.r_[starts, len(ordered)])
    within = np.arange(len(ordered)) - np.repeat(starts, runs)
    mask = np.empty(len(groups), dtype=bool)
    mask[order] = within < limit
    return mask


def _bars(
    examples: Mapping[Any, list[Example]], names: Sequence[str] | None, size: int, limit: int
) -> np.ndarray:
    """Per group (a format's code, a number), the rank a row must be below to be kept."""
    bars = np.full(size, np.iinfo(np.uint64).max, dtype=np.uint64)
    for key, found in examples.items():
        if len(found) < limit:
            continue
        number = int(key) if str(key).isdigit() else 0  # "unknown" channels: 0
        code = names.index(key) if names is not None else number
        if code < size:
            bars[code] = found[-1][0]
    return bars


def merged(parts: Iterable[ImageStats]) -> ImageStats:
    """One :class:`ImageStats` of all ``parts``."""
    out = ImageStats()
    for part in parts:
        out.merge(part)
    return out


def encode(doc: Any) -> bytes:
    """Compact, key-sorted JSON (a histogram is one line, not one line per bin)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class VersionStats:
    """A version's ``imagestats.json``: per split bucket; and its base's, when it grew from one."""

    buckets: dict[int, ImageStats]
    base: dict[int, ImageStats] | None = None  # the version this one grew from
    base_fingerprint: str = ""

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "bins": {"exact_below": EXACT, "per_octave": PER_OCTAVE},
            "buckets": _buckets_json(self.buckets),
            "version": VERSION,
        }
        if self.base is not None:
            base = _buckets_json(self.base)
            doc["base"] = {"buckets": base, "fingerprint": self.base_fingerprint}
        return encode(doc)

    @classmethod
    def from_json(cls, data: bytes, source: str) -> VersionStats:
        try:
            doc = json.loads(data)
            if doc.get("version") != VERSION:
                raise ValueError(f"version {doc.get('version')!r}, expected {VERSION}")
            base = doc.get("base")
            return cls(
                _buckets_from(doc["buckets"]),
                _buckets_from(base["buckets"]) if base else None,
                str(base["fingerprint"]) if base else "",
            )
        except (
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            OverflowError,
            RecursionError,
        ) as exc:
            what = f"{source}: not an image statistics file: {exc}"
            raise InputError(what, path=source) from None


def _buckets_json(buckets: Mapping[int, ImageStats]) -> dict[str, Any]:
    return {f"{b:05d}": s.to_json() for b, s in sorted(buckets.items())}


def _buckets_from(doc: Mapping[str, Any]) -> dict[int, ImageStats]:
    return {int(b): ImageStats.from_json(s) for b, s in doc.items()}


def read_version(directory: str, **options: Any) -> VersionStats | None:
    """The ``imagestats.json`` of the version at ``directory``; None when it has none."""
    fs, path = storage.open_url(storage.join(directory, layout.IMAGESTATS_NAME), **options)
    try:
        data = storage.read_bytes(fs, path)
    except FileNotFoundError:
        return None
    return VersionStats.from_json(data, source=path)
