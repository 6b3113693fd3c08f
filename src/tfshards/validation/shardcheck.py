"""Check one shard against its manifest entry: bytes, framing, records, index, in bounded memory.

:func:`validate_shard` is the unit of work of :func:`tfshards.validation.validate.validate`
(and of the scan :func:`tfshards.reading.corruption.find_corrupt_record` runs), on
plain values any executor can carry. Memory does not grow with what the file
holds: a shard is checked ``WINDOW_BYTES`` of whole records at a time (a
compressed one as its stream inflates, when its bytes match the manifest), a
compressed stream that differs from the manifest is inflated piece by piece
and only its framing walked, and problems past ``max_problems`` are counted,
not kept.
"""

from __future__ import annotations

import builtins
import hashlib
import itertools
import posixpath
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import storage
from tfshards.format import phash
from tfshards.format.columns import Column
from tfshards.format.exampleparser import DecodeError, decode
from tfshards.format.records import parse_records
from tfshards.format.schema import FeatureSpec
from tfshards.format.tfrecord import inflate, masked_crc, read_header
from tfshards.format.wire import FOOTER_BYTES, HEADER_BYTES, LENGTH
from tfshards.shardset import buckets, check, layout
from tfshards.shardset.grouping import GroupBy
from tfshards.shardset.manifest import Manifest, ShardInfo
from tfshards.validation import phashcache
from tfshards.validation.config import MAX_PROBLEMS
from tfshards.validation.recordcheck import RecordChecker, check_records
from tfshards.validation.rules import Problem
from tfshards.validation.streamcheck import check_stream, frame_size, whole_records


@dataclass(frozen=True)
class ShardCheck:
    """One shard's work, as plain picklable values (any executor can run it)."""

    root: str
    name: str
    records: int
    bytes: int
    sha256: str
    compression: str
    schema: tuple[FeatureSpec, ...]
    num_labels: int
    image_feature: str  # the raw file bytes (Manifest.image_feature)
    check_sha: bool  # compare the stored sha256 feature with the payload's
    decode_images: bool
    max_problems: int
    storage_options: Mapping[str, Any]
    index_sha256: str | None = None  # of its record index file; None: it has none
    records_sha256: str | None = None  # of its member list; None: it has none
    group_by: str | None = None  # the manifest's grouping: report each record's group
    columns: tuple[Column, ...] = ()  # the manifest's extra columns: lengths and bounds
    near_duplicates: bool = False  # hash each image (tfshards.format.phash), or read the cache
    bucket: tuple[int, int] | None = None  # (its split bucket, the set's count); None: none

    @property
    def entry(self) -> ShardInfo:
        """Its manifest entry, as :mod:`tfshards.shardset.check` compares a file with it."""
        return ShardInfo(self.name, self.records, self.bytes, self.sha256, self.index_sha256)

    @classmethod
    def of(
        cls,
        manifest: Manifest,
        shard: ShardInfo,
        *,
        path: str | None = None,
        decode_images: bool = False,
        near_duplicates: bool = False,
        max_problems: int = MAX_PROBLEMS,
        storage_options: Mapping[str, Any] | None = None,
    ) -> ShardCheck:
        """The check of ``shard`` as the manifest describes it (at ``path``, if given: no index)."""
        where = path or storage.join(manifest.directory, shard.name)
        return cls(
            root=storage.absolute(posixpath.dirname(where)),
            name=posixpath.basename(where),
            records=shard.records,
            bytes=shard.bytes,
            sha256=shard.sha256,
            compression=manifest.compression,
            schema=manifest.schema,
            num_labels=len(manifest.labels),
            image_feature=manifest.image_feature,
            # A transform may replace the payload; the stored sha256 is of the original file.
            check_sha=manifest.transform == "none",
            decode_images=decode_images,
            max_problems=max_problems,
            storage_options=dict(storage_options or {}),
            # A copy elsewhere (the loader's cache) has no index beside it.
            index_sha256=shard.index_sha256 if path is None else None,
            records_sha256=shard.records_sha256 if path is None else None,
            group_by=manifest.group_by,
            columns=manifest.columns,
            near_duplicates=near_duplicates,
            bucket=_bucket(manifest, shard),
        )


def _bucket(manifest: Manifest, shard: ShardInfo) -> tuple[int, int] | None:
    """The shard's split bucket and the set's bucket count, where the manifest has both."""
    count = manifest.params.get("buckets")
    if shard.bucket is None or not buckets.is_count(count):
        return None  # the set rule buckets_in_range says what is wrong
    return shard.bucket, count


@dataclass(frozen=True)
class ShardReport:
    """What :func:`validate_shard` found in one shard."""

    name: str
    records: int
    bytes: int
    label_counts: tuple[int, ...]  # records per label index, in range only
    problems: tuple[Problem, ...]  # the first ``max_problems``
    problem_count: int
    # Record i's stored sha256 at [32 * i : 32 * i + 32] (zeros: none read), for duplicates.
    digests: builtins.bytes = b""
    groups: tuple[str, ...] = ()  # sorted group keys of its records (with a group_by)
    # Record i's label id as an int32 at [4 * i : 4 * i + 4] (-1: none), for label conflicts.
    record_labels: builtins.bytes = b""
    # Record i's perceptual hash row (tfshards.format.phash.DTYPE), with near_duplicates.
    phashes: builtins.bytes = b""


@dataclass
class _Kept:
    """What each record leaves for the set's duplicate search, in record order.

    ``digests``: its stored sha256, 32 bytes (zeros: none read); ``labels``:
    its label id as a native int32 (-1: none read).
    """

    digests: bytearray = field(default_factory=bytearray)
    labels: bytearray = field(default_factory=bytearray)

    def make_room(self, records: int) -> None:
        """Add ``records`` empty slots, filled in place by the record checker."""
        self.digests.extend(bytes(32 * records))
        self.labels.extend(b"\xff" * (4 * records))


class _Found:
    """Problems of one file: keeps the first ``limit``, counts all."""

    def __init__(self, where: str, limit: int) -> None:
        self.where, self.limit, self.count = where, limit, 0
        self.kept: list[Problem] = []

    def add(self, what: str, index: int | None = None, offset: int | None = None) -> None:
        self.count += 1
        if len(self.kept) < self.limit:
            self.kept.append(Problem(self.where, what, index, offset))

    def add_at(self, where: str, what: str) -> None:
        """A problem of another file that belongs with this one (its record index)."""
        self.count += 1
        if len(self.kept) < self.limit:
            self.kept.append(Problem(where, what))

    def absorb(self, other: _Found) -> None:
        """``other``'s problems, after this one's."""
        self.count += other.count
        self.kept += other.kept[: max(0, self.limit - len(self.kept))]


def validate_shard(task: ShardCheck) -> ShardReport:
    """Check one shard's bytes, framing and records against its manifest entry.

    Memory stays bounded by the manifest's shard size whatever the file holds
    (measured in docs/reliability.md): an uncompressed shard is read and checked in
    windows of whole records, a file larger than the manifest says is hashed
    and its framing walked in pieces, and a gzip/zlib shard whose size and
    sha256 match the manifest has its records checked in such windows as its
    stream inflates; otherwise its stream is inflated piece by piece and only
    its framing is walked (:mod:`tfshards.shardset.check`).
    """
    cached = None
    if task.near_duplicates:
        cached = phashcache.get(task.sha256, task.image_feature, task.records)
    tally = _Tally(task, _Found(task.name, task.max_problems), hashing=cached is None)
    fs, root = storage.open_url(task.root, **task.storage_options)
    records, size = _check_shard(fs, root, tally)
    if task.index_sha256 is not None:
        _check_companion(fs, root, task, tally.found, layout.INDEX, task.index_sha256)
    if task.records_sha256 is not None:
        _check_companion(fs, root, task, tally.found, layout.RECORDS, task.records_sha256)
    rows = b""
    if task.near_duplicates:
        rows = cached if cached is not None else tally.hashes()
        if not tally.matches:  # missing, or not the manifest's bytes: its images match nothing
            rows = bytes(task.records * phash.DTYPE.itemsize)
        elif cached is None and not tally.found.count:  # the manifest's bytes: kept
            phashcache.put(task.sha256, task.image_feature, rows)
    return ShardReport(
        task.name,
        records,
        size,
        tuple(tally.labels),
        tuple(tally.found.kept),
        tally.found.count,
        bytes(tally.kept.digests),
        tuple(sorted(tally.groups)),
        bytes(tally.kept.labels),
        rows,
    )


class _Tally:
    """What one shard's check adds up: its problems, label counts, kept digests and groups."""

    def __init__(self, task: ShardCheck, found: _Found, *, hashing: bool = False) -> None:
        self.task, self.found = task, found
        self.labels = [0] * task.num_labels
        self.kept = _Kept()  # sized once the records are in memory
        self.groups: set[str] = set()
        # Each window's perceptual hash rows, with near_duplicates and no cached rows.
        self.phashes: list[bytes] | None = [] if task.near_duplicates and hashing else None
        self.matches = False  # the file's size and sha256 are the manifest's

    def hash_images(self, window: builtins.bytes | memoryview, count: int) -> None:
        """The hash rows of the first ``count`` records of ``window`` (whole records)."""
        if self.phashes is None or count <= 0:
            return
        feature = self.task.image_feature
        parsed = itertools.islice(parse_records(window, [feature]), count)
        payloads = [
            p.fields[feature].first if p.fields and feature in p.fields else None for p in parsed
        ]
        rows = phash.image_hashes(payloads).tobytes()
        self.phashes.append(rows.ljust(count * phash.DTYPE.itemsize, b"\0"))  # cut short: ok 0

    def hashes(self) -> builtins.bytes:
        """The shard's hash rows, one per record the manifest counts."""
        size = self.task.records * phash.DTYPE.itemsize
        return b"".join(self.phashes or [])[:size].ljust(size, b"\0")

    def checker(self, add: Callable[[str, int, int], None], kept: _Kept) -> RecordChecker:
        """The record checker of the shard: problems to ``add``, counts in place."""
        task = self.task
        return RecordChecker(
            task.schema,
            task.image_feature,
            num_labels=task.num_labels,
            check_sha=task.check_sha,
            decode_images=task.decode_images,
            labels=self.labels,
            add=add,
            digests=kept.digests,
            record_labels=kept.labels,
            group_by=GroupBy.parse(task.group_by),
            groups=self.groups,
            columns=task.columns,
            bucket=task.bucket,
        )

    def compare_file(self, size: int, sha256: str) -> None:
        mismatches = check.bytes_mismatches(self.task.entry, size, sha256)
        self.matches = not mismatches
        for what, _, _ in mismatches:
            self.found.add(what)


def _check_shard(fs: Any, root: str, tally: _Tally) -> tuple[int, int]:
    """The shard file's checks; its records and bytes as found."""
    task, found = tally.task, tally.found
    try:
        with fs.open(storage.join(root, task.name), "rb") as f:
            hold = task.bytes + HOLD_SLACK
            size = _size(f)
            records: int | None
            if task.compression == "none" and size is not None and size <= hold:
                records, read_size = _check_windows(f, size, tally)
            else:
                records, read_size = _check_read(f, hold, tally)
    except FileNotFoundError:
        found.add(check.missing(task.entry))
        return 0, 0
    except OSError as exc:
        found.add(f"cannot read: {exc.strerror or exc}")
        return 0, 0
    if records is not None and records != task.records:
        found.add(check.count_mismatch(task.entry, records))
    return records or 0, read_size


def _size(f: Any) -> int | None:
    """The open file's size, leaving it at its start (None: it cannot seek)."""
    try:
        size = int(f.seek(0, 2))
        f.seek(0)
    except (OSError, ValueError):
        return None
    return size


_COMPANION_NAMES = {layout.INDEX: "record index", layout.RECORDS: "member list"}


def _check_companion(
    fs: Any, root: str, task: ShardCheck, found: _Found, companion: layout.Companion, sha: str
) -> None:
    """A companion file (record index, member list) against the sha256 the manifest holds."""
    rel = companion.path(task.name)
    try:
        data = storage.read_bytes(fs, storage.join(root, rel))
    except FileNotFoundError:
        found.add_at(rel, f"missing: expected the {_COMPANION_NAMES[companion]} of {task.name}")
        return
    except OSError as exc:
        found.add_at(rel, f"cannot read: {exc.strerror or exc}")
        return
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha:
        found.add_at(rel, f"sha256 mismatch: expected {sha}, found {digest}")


READ_CHUNK = check.READ_BYTES  # hashed and walked at a time past what is held
HOLD_SLACK = 1 << 20  # bytes held past the manifest's size: a few appended bytes still get parsed
# Whole records checked at a time in an uncompressed shard: a worker's memory stays near this
# whatever the shard's size. Smaller is not slower: on 200,000 records of 1 KB in 4 shards
# (one process) 1 MB windows took 0.69 s of CPU and peaked at 55 MB, whole shards 0.92 s and
# 147 MB; on 4,000 records of 64 KB, 0.54 s against 0.63 s.
WINDOW_BYTES = 1 << 20


def _check_read(f: Any, hold: int, tally: _Tally) -> tuple[int | None, int]:
    """A file held whole when it fits in ``hold`` bytes, else streamed in pieces.

    Reports its size and hash, then its records; returns how many records
    (None: unknown) and its size.
    """
    task = tally.task
    held = f.read(hold + 1)
    if len(held) <= hold:
        sha256 = hashlib.sha256(held).hexdigest()
        tally.compare_file(len(held), sha256)
        if task.compression == "none":  # a file that cannot seek, within its manifest size
            return _check_records(held, tally), len(held)
        if (len(held), sha256) == (task.bytes, task.sha256):
            return _check_inflating(held, tally), len(held)
        # Untrusted and compressed: inflate and walk the framing in pieces.
        read = check.read([held], task.compression, hashed=False)
    else:  # too large to hold: hash, inflate and walk the framing in pieces
        rest = iter(lambda: f.read(READ_CHUNK), b"")
        read = check.read(itertools.chain([held], rest), task.compression)
        tally.compare_file(read.size, read.sha256 or "")
    broken = check.framing_mismatch(read)
    if broken is not None:
        tally.found.add(*broken)
    return read.records, read.size


def _check_windows(f: Any, size: int, tally: _Tally) -> tuple[int, int]:
    """An uncompressed shard of ``size`` bytes, read and checked ``WINDOW_BYTES`` at a time.

    Each window ends at a record boundary (the next window starts there), so
    the checks see whole records and report what a check of the whole file
    would, in the same order: the file's size and sha256 first, then its
    records. Once the framing breaks (a length CRC that does not hold), the
    rest is only hashed, as :func:`~tfshards.validation.recordcheck.check_records` stops
    there. Returns the records found and the bytes read.
    """
    in_records = _Found(tally.task.name, tally.task.max_problems)
    digest = hashlib.sha256()
    pos = records = 0
    checking = True
    want = WINDOW_BYTES
    while pos < size:
        f.seek(pos)
        window = f.read(min(want, size - pos))
        if not window:
            break  # the file shrank while being read
        last = pos + len(window) >= size or len(window) < HEADER_BYTES  # short: it shrank
        end, walked = (len(window), -1) if last or not checking else whole_records(window)
        if end == 0:  # its first record is longer than the window
            need = frame_size(window)
            if need is not None:
                want = need
                continue  # read it whole
            end, walked = len(window), -1  # its length CRC fails: checked (and reported), last
        want = WINDOW_BYTES
        part = memoryview(window)[:end]
        digest.update(part)
        if checking:
            whole = window if end == len(window) else window[:end]
            found_here = _check_window(whole, tally, in_records, records, pos)
            checking = found_here == walked  # fewer: the framing broke inside this window
            records += found_here
        pos += end
    tally.compare_file(pos, digest.hexdigest())
    tally.found.absorb(in_records)
    return records, pos


def _check_window(
    window: bytes | memoryview, tally: _Tally, found: _Found, first: int, offset: int
) -> int:
    """Check whole records ``window`` (record ``first`` at byte ``offset``); how many it holds."""
    wanted = max(0, tally.task.records - first)  # records past the manifest's count keep no digest
    # A record takes at least 16 bytes, so a manifest claiming more records cannot inflate this.
    here = _Kept()
    here.make_room(min(wanted, len(window) // 16))

    def add(what: str, index: int, at: int) -> None:
        found.add(what, first + index, offset + at)

    if first == 0:
        _unlisted_features(window, tally.task.schema, add)
    count = check_records(window, tally.checker(add, here))
    tally.kept.digests += here.digests[: 32 * min(count, wanted)]
    tally.kept.labels += here.labels[: 4 * min(count, wanted)]
    tally.hash_images(window, min(count, wanted))
    return count


def _unlisted_features(
    window: bytes | memoryview, schema: Sequence[FeatureSpec], add: Callable[[str, int, int], None]
) -> None:
    """The features the shard's first record holds and the manifest's schema lacks (a
    schema edited by hand, or a writer's bug): the rules check the schema's features in
    each record, not what else it holds. One record a shard: a writer gives every record
    of a set the same features, and a shard that matches the manifest is its bytes.

    The CRCs are computed in Python only where extra names were found (a set
    without them never imports the ``crc32c`` package: 10-14 ms a process)."""
    if len(window) < HEADER_BYTES:
        return
    (length,) = LENGTH.unpack_from(window)
    end = HEADER_BYTES + length
    if len(window) < end + FOOTER_BYTES:
        return  # the framing rules say so
    data = memoryview(window)[HEADER_BYTES:end]
    try:
        names = decode(data)
    except (DecodeError, UnicodeDecodeError):
        return  # the record rules say so
    extra = sorted(set(names) - {spec.name for spec in schema})
    if extra and _framed_whole(window, data, end):
        listed = sorted(spec.name for spec in schema)
        add(
            f"features {extra} are in the records but not in the manifest's schema {listed}",
            0,
            0,
        )


def _framed_whole(window: bytes | memoryview, data: memoryview, end: int) -> bool:
    """Whether the record ``data`` (ending at ``end`` of ``window``) has both CRCs right:
    damaged, its names may be garbled, and the framing and record rules say so."""
    _, problem = read_header(memoryview(window)[:HEADER_BYTES])
    stored = int.from_bytes(window[end : end + FOOTER_BYTES], "little")
    return problem is None and stored == masked_crc(data)


def _check_inflating(held: bytes, tally: _Tally) -> int | None:
    """A compressed shard whose bytes match the manifest: its records, checked as it inflates.

    Windows of ``WINDOW_BYTES`` of whole records, as for an uncompressed
    shard, so a stream that inflates to GBs (a 1 MB gzip member of 1 GiB of
    zeros) is never held. A stream that does not inflate is reported before
    the problems of the records read up to there, and its records are not
    counted (None).
    """
    compression = tally.task.compression
    in_records = _Found(tally.task.name, tally.task.max_problems)

    def check_window(window: memoryview, first: int, offset: int) -> int:
        return _check_window(window, tally, in_records, first, offset)

    records: int | None
    try:
        records = check_stream(
            inflate(held, compression), check_window, in_records.add, WINDOW_BYTES
        )
    except zlib.error as exc:
        tally.found.add(check.cannot_decompress(compression, str(exc)))
        records = None
    tally.found.absorb(in_records)
    return records


def _check_records(buf: bytes, tally: _Tally) -> int:
    """Every record of a shard held in memory (one that cannot seek, within its manifest size)."""
    # A record takes at least 16 bytes, so a manifest claiming more records cannot inflate this.
    tally.kept.make_room(min(tally.task.records, len(buf) // 16))
    _unlisted_features(buf, tally.task.schema, tally.found.add)
    count = check_records(buf, tally.checker(tally.found.add, tally.kept))
    tally.hash_images(buf, min(count, tally.task.records))
    return count
