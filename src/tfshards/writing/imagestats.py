"""Image statistics in the write pass: from each shard's framed records, then per split bucket.

A shard's buffer hands every flush of whole records to :class:`ShardImages`,
which reads each payload's header (:mod:`tfshards.format.imageheader`) from
memory: no file is read twice. A shard kept from an earlier run or version
brings its companion (``imagestats/<shard>.json``); where that is missing (a
version written before statistics) they are counted from its records. The
writer merges the shards' statistics per split bucket, in shard order, into
``imagestats.json`` (:class:`~tfshards.shardset.imagestats.VersionStats`),
with the buckets of the previous version copied under ``base`` so a gate can
compare with it after that version is pruned.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from tfshards import atomicfile, storage
from tfshards.errors import InputError, TfshardsError
from tfshards.format import exif, native, tfrecord
from tfshards.format.exampleparser import outline
from tfshards.format.imageheader import NATIVE_FORMATS, read_header
from tfshards.format.wire import FOOTER_BYTES, HEADER_BYTES
from tfshards.shardset import layout
from tfshards.shardset.imagestats import ImageStats, VersionStats, encode, read_version
from tfshards.shardset.manifest import Manifest

PATH_FEATURE = "path"
BATCH_ROWS = 1 << 14  # rows counted at once: 40 B each, a few numpy calls per 16,384 records


class ShardImages:
    """The statistics of the images in the records flushed through one shard's buffer."""

    def __init__(self, image_feature: str) -> None:
        self._stats = ImageStats()
        self._pending: list[np.ndarray] = []  # rows fed, not yet counted
        self._waiting = 0
        self._names = (image_feature, PATH_FEATURE)
        self._order = (image_feature.encode(), PATH_FEATURE.encode())

    def feed(self, view: memoryview) -> None:
        """Count the images of ``view``: whole framed records (a buffer's flush)."""
        c = native.NATIVE
        if c is None:
            starts, end = tfrecord.record_starts(view)
            stops = (np.append(starts[1:], end) - FOOTER_BYTES).tolist()
            for a, b in zip((starts + HEADER_BYTES).tolist(), stops, strict=True):
                self._outlined(view[a:b])
            return
        found, _ = c.image_records(view, *self._order)
        rows = np.frombuffer(found, dtype=np.int64).reshape(-1, 9)
        bad = rows[:, 0] < 0  # not so for records this writer framed; the reference reads them
        if bad.any():
            starts, _ = tfrecord.record_starts(view)
            for at in starts[bad].tolist():
                length = int.from_bytes(view[at : at + 8], "little")
                self._outlined(view[at + HEADER_BYTES : at + HEADER_BYTES + length])
            rows = rows[~bad]

        def path(i: int) -> str:
            return str(view[rows[i, 5] : rows[i, 6]], "utf-8", "surrogateescape")

        self._stats.keep_examples(NATIVE_FORMATS, rows, path)
        self._pending.append(np.column_stack((rows[:, :5], rows[:, 8])))
        self._waiting += len(rows)
        if self._waiting >= BATCH_ROWS:
            self._count()

    @property
    def stats(self) -> ImageStats:
        """Everything fed so far."""
        self._count()
        return self._stats

    def _count(self) -> None:
        if self._pending:
            self._stats.add_many(NATIVE_FORMATS, np.concatenate(self._pending))
            self._pending, self._waiting = [], 0

    def _outlined(self, data: memoryview) -> None:
        fields = outline(data, self._names)
        path = fields[PATH_FEATURE].first
        self._add(self._stats, fields[self._names[0]].first, str(path, "utf-8", "surrogateescape"))

    @staticmethod
    def _add(stats: ImageStats, payload: memoryview, path: str) -> None:
        fmt, width, height, channels = read_header(payload)
        stats.add(fmt, width, height, channels, len(payload), path, exif.orientation(payload))


def of_shard(data: bytes, compression: str, image_feature: str) -> ImageStats:
    """The statistics of a whole shard's bytes (as stored: compressed or not)."""
    images = ShardImages(image_feature)
    images.feed(memoryview(tfrecord.decompress(data, compression)))
    return images.stats


def save_shard(
    fs: Any, version: str, shard: str, stats: ImageStats, *, durable: bool = True
) -> None:
    """Publish ``shard``'s companion ``imagestats/<shard>.json``, unless it holds these bytes.

    A shard kept on resume keeps its companion's mtime too, so ``prune`` still
    sees the killed writer's version as idle. ``durable=False``: not fsynced
    here (the writer syncs a version's new files in one pass).
    """
    path = layout.stats_path(version, shard)
    data = encode(stats.to_json())
    try:
        if storage.read_bytes(fs, path) == data:
            return
    except OSError:
        pass  # not there yet
    try:
        # the writer syncs the folder
        atomicfile.write_atomic(fs, path, [data], sync_dir=False, durable=durable)
    except OSError as exc:
        raise storage.write_error(fs, path, exc) from None


def read_base(previous: Manifest | None, fingerprint: str, **options: Any) -> VersionStats | None:
    """The statistics of the version a write follows (read once for :func:`carried` and
    :func:`save_version`); None when there is none, it is this version, or they are unreadable."""
    if previous is None or previous.fingerprint == fingerprint:
        return None
    with contextlib.suppress(InputError, OSError):  # unreadable: nothing to carry or compare
        return read_version(previous.directory, **options)
    return None


def carried(
    base: Manifest, kept_buckets: Iterable[int | None], found: VersionStats | None
) -> dict[int, ImageStats]:
    """The base version's statistics (``found``) of each split bucket whose every shard is kept.

    Those buckets' totals carry over whole (the merge is a sum, in any order),
    so their shards' companions need not be read: 64 of them read and merged
    were ~40 ms of a 1% append's ~200 ms of CPU. Empty without ``found``.
    """
    kept = Counter(b for b in kept_buckets if b is not None)
    total = Counter(s.bucket for s in base.shards)
    whole = [b for b, n in kept.items() if n == total[b]]
    if found is None:
        return {}
    return {b: found.buckets[b] for b in whole if b in found.buckets}


def kept(
    fs_in: Any,
    base: str,
    old: str,
    fs_out: Any,
    version: str,
    new: str,
    params: Mapping[str, Any],
    place: Callable[[str, str], None],
    counted: bool = False,
) -> ImageStats | None:
    """The statistics of shard ``old`` of ``base``, kept as ``new``; its companion published.

    A readable companion of the base is placed as it is (``place``: the hard link
    or copy the shard got; 64 fsynced rewrites were 0.49 s of a 1% append's
    ~1.3 s wall here), else the statistics are counted from the shard's records.
    ``counted``: its bucket's total is carried (:func:`carried`), so the
    companion is placed unread and None is returned.
    """
    src, dst = layout.stats_path(base, old), layout.stats_path(version, new)
    if counted:
        with contextlib.suppress(OSError, TfshardsError):  # no companion: counted below
            place(src, dst)
            return None
    try:
        stats = ImageStats.from_json(json.loads(storage.read_bytes(fs_in, src)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        data = storage.read_bytes(fs_out, storage.join(version, new))
        stats = of_shard(data, str(params["compression"]), str(params["image_feature"]))
        save_shard(fs_out, version, new, stats)
    else:
        place(src, dst)
    return None if counted else stats


def save_version(
    fs: Any,
    version: str,
    shards: Iterable[tuple[int | None, ImageStats | None]],
    previous: Manifest | None,
    base: VersionStats | None,
) -> None:
    """Merge ``(bucket, stats)`` of each shard, in order, into ``version/imagestats.json``.

    ``base``, the statistics of ``previous`` (:func:`read_base`), go under ``base``.
    """
    buckets: dict[int, ImageStats] = {}
    for bucket, stats in shards:
        if stats is not None:
            buckets.setdefault(bucket or 0, ImageStats()).merge(stats)
    doc = VersionStats(
        buckets,
        base.buckets if base is not None else None,
        previous.fingerprint if base is not None and previous is not None else "",
    )
    path = storage.join(version, layout.IMAGESTATS_NAME)
    try:
        # The writer syncs it with the version's new files, in one pass before the manifest.
        atomicfile.write_atomic(fs, path, [doc.to_json()], sync_dir=False, durable=False)
    except OSError as exc:
        raise storage.write_error(fs, path, exc) from None
