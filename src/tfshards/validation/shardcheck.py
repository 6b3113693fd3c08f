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
import posixpath
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tfshards import storage
from tfshards.format.schema import FeatureSpec
from tfshards.format.tfrecord import inflate
from tfshards.format.wire import HEADER_BYTES
from tfshards.shardset import layout
from tfshards.shardset.grouping import GroupBy
from tfshards.shardset.manifest import Manifest, ShardInfo
from tfshards.validation.recordcheck import RecordChecker, check_records
from tfshards.validation.rules import Problem
from tfshards.validation.streamcheck import check_stream, frame_size, walk_framing, whole_records

MAX_PROBLEMS = 50  # kept per shard, and printed: enough to see a pattern, few enough to read


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
    image_feature: str  # the raw file bytes (manifest.params["image_feature"])
    check_sha: bool  # compare the stored sha256 feature with the payload's
    decode_images: bool
    max_problems: int
    storage_options: Mapping[str, Any]
    index_sha256: str | None = None  # of its record index file; None: it has none
    group_by: str | None = None  # the manifest's grouping: report each record's group

    @classmethod
    def of(
        cls,
        manifest: Manifest,
        shard: ShardInfo,
        *,
        path: str | None = None,
        decode_images: bool = False,
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
            image_feature=str(manifest.params.get("image_feature", "image")),
            # A transform may replace the payload; the stored sha256 is of the original file.
            check_sha=manifest.params.get("transform") == "none",
            decode_images=decode_images,
            max_problems=max_problems,
            storage_options=dict(storage_options or {}),
            # A copy elsewhere (the loader's cache) has no index beside it.
            index_sha256=shard.index_sha256 if path is None else None,
            group_by=manifest.params.get("group_by"),
        )


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
    (measured in the README): an uncompressed shard is read and checked in
    windows of whole records, a file larger than the manifest says is hashed
    and its framing walked in pieces, and a gzip/zlib shard whose size and
    sha256 match the manifest has its records checked in such windows as its
    stream inflates; otherwise its stream is inflated piece by piece and only
    its framing is walked.
    """
    found = _Found(task.name, task.max_problems)
    labels = [0] * task.num_labels
    kept = _Kept()  # sized once the records are in memory
    groups: set[str] = set()
    fs, root = storage.open_url(task.root, **task.storage_options)
    records, size = _check_shard(fs, root, task, found, labels, kept, groups)
    if task.index_sha256 is not None:
        _check_index(fs, root, task, found)
    return ShardReport(
        task.name,
        records,
        size,
        tuple(labels),
        tuple(found.kept),
        found.count,
        bytes(kept.digests),
        tuple(sorted(groups)),
        bytes(kept.labels),
    )


def _check_shard(
    fs: Any,
    root: str,
    task: ShardCheck,
    found: _Found,
    labels: list[int],
    kept: _Kept,
    groups: set[str],
) -> tuple[int, int]:
    """The shard file's checks; its records and bytes as found."""
    try:
        with fs.open(storage.join(root, task.name), "rb") as f:
            hold = task.bytes + HOLD_SLACK
            size = _size(f)
            records: int | None
            if task.compression == "none" and size is not None and size <= hold:
                records, read_size = _check_windows(f, size, task, found, labels, kept, groups)
            else:
                read = _Read(f, hold)
                records = _check_read(read, task, found, labels, kept, groups)
                read_size = read.size
    except FileNotFoundError:
        found.add(f"missing: expected {task.bytes} bytes holding {task.records} records")
        return 0, 0
    except OSError as exc:
        found.add(f"cannot read: {exc.strerror or exc}")
        return 0, 0
    if records is not None and records != task.records:
        found.add(f"record count mismatch: expected {task.records}, found {records}")
    return records or 0, read_size


def _size(f: Any) -> int | None:
    """The open file's size, leaving it at its start (None: it cannot seek)."""
    try:
        size = int(f.seek(0, 2))
        f.seek(0)
    except (OSError, ValueError):
        return None
    return size


def _check_index(fs: Any, root: str, task: ShardCheck, found: _Found) -> None:
    """The record index file against the sha256 the manifest holds for it."""
    rel = layout.INDEX.path(task.name)
    try:
        data = storage.read_bytes(fs, storage.join(root, rel))
    except FileNotFoundError:
        found.add_at(rel, f"missing: expected the record index of {task.name}")
        return
    except OSError as exc:
        found.add_at(rel, f"cannot read: {exc.strerror or exc}")
        return
    digest = hashlib.sha256(data).hexdigest()
    if digest != task.index_sha256:
        found.add_at(rel, f"sha256 mismatch: expected {task.index_sha256}, found {digest}")


READ_CHUNK = 4 << 20  # hashed and walked at a time past what is held
HOLD_SLACK = 1 << 20  # bytes held past the manifest's size: a few appended bytes still get parsed
# Whole records checked at a time in an uncompressed shard: a worker's memory stays near this
# whatever the shard's size. Smaller is not slower: on 200,000 records of 1 KB in 4 shards
# (one process) 1 MB windows took 0.69 s of CPU and peaked at 55 MB, whole shards 0.92 s and
# 147 MB; on 4,000 records of 64 KB, 0.54 s against 0.63 s.
WINDOW_BYTES = 1 << 20


class _Read:
    """A shard file: held whole when it fits in ``hold`` bytes, else streamed in pieces.

    ``size`` and ``sha256`` are final once :meth:`rest` is used up (at once
    for a held file).
    """

    def __init__(self, f: Any, hold: int) -> None:
        self.f = f
        self.held = f.read(hold + 1)
        self.fits = len(self.held) <= hold
        self.size, self._digest = len(self.held), hashlib.sha256(self.held)

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def rest(self) -> Iterator[bytes]:
        """The whole file in pieces (hashing as it goes); the held part is let go."""
        held, self.held = self.held, b""
        yield held
        while chunk := self.f.read(READ_CHUNK):
            self._digest.update(chunk)
            self.size += len(chunk)
            yield chunk


def _check_read(
    read: _Read,
    task: ShardCheck,
    found: _Found,
    labels: list[int],
    kept: _Kept,
    groups: set[str],
) -> int | None:
    """Report the file's size and hash, then its records; how many records (None: unknown)."""
    if read.fits:
        _compare_file(read.size, read.sha256, task, found)
        if task.compression == "none":  # a file that cannot seek, within its manifest size
            held, read.held = read.held, b""
            return _check_records(held, task, found, labels, kept, groups)
        if (read.size, read.sha256) == (task.bytes, task.sha256):
            held, read.held = read.held, b""
            return _check_inflating(held, task, found, labels, kept, groups)
        pieces: Iterator[bytes] = iter([read.held])
    else:
        pieces = read.rest()
    # Untrusted and compressed, or too large to hold: inflate and walk the framing in pieces.
    records, problem = None, None
    try:
        walk = walk_framing(
            pieces if task.compression == "none" else inflate(pieces, task.compression)
        )
    except zlib.error as exc:
        problem = f"cannot decompress ({task.compression}): {exc}"
    else:
        records = walk.records
    for _ in pieces:  # hash what the walk left
        pass
    if not read.fits:
        _compare_file(read.size, read.sha256, task, found)
    if problem is not None:
        found.add(problem)
    elif walk.problem is not None:
        found.add(walk.problem, walk.records, walk.offset)
    return records


def _compare_file(size: int, sha256: str, task: ShardCheck, found: _Found) -> None:
    if size != task.bytes:
        found.add(f"size mismatch: expected {task.bytes} bytes, found {size}")
    if sha256 != task.sha256:
        found.add(f"sha256 mismatch: expected {task.sha256}, found {sha256}")


def _check_windows(
    f: Any,
    size: int,
    task: ShardCheck,
    found: _Found,
    labels: list[int],
    kept: _Kept,
    groups: set[str],
) -> tuple[int, int]:
    """An uncompressed shard of ``size`` bytes, read and checked ``WINDOW_BYTES`` at a time.

    Each window ends at a record boundary (the next window starts there), so
    the checks see whole records and report what a check of the whole file
    would, in the same order: the file's size and sha256 first, then its
    records. Once the framing breaks (a length CRC that does not hold), the
    rest is only hashed, as :func:`~tfshards.validation.recordcheck.check_records` stops
    there. Returns the records found and the bytes read.
    """
    in_records = _Found(task.name, task.max_problems)
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
            found_here = _check_window(whole, task, in_records, labels, kept, groups, records, pos)
            checking = found_here == walked  # fewer: the framing broke inside this window
            records += found_here
        pos += end
    _compare_file(pos, digest.hexdigest(), task, found)
    found.absorb(in_records)
    return records, pos


def _check_window(
    window: bytes | memoryview,
    task: ShardCheck,
    found: _Found,
    labels: list[int],
    kept: _Kept,
    groups: set[str],
    first: int,
    offset: int,
) -> int:
    """Check whole records ``window`` (record ``first`` at byte ``offset``); how many it holds."""
    wanted = max(0, task.records - first)  # records past the manifest's count keep no digest
    # A record takes at least 16 bytes, so a manifest claiming more records cannot inflate this.
    here = _Kept()
    here.make_room(min(wanted, len(window) // 16))

    def add(what: str, index: int, at: int) -> None:
        found.add(what, first + index, offset + at)

    count = check_records(window, _checker(task, labels, add, here, groups))
    kept.digests += here.digests[: 32 * min(count, wanted)]
    kept.labels += here.labels[: 4 * min(count, wanted)]
    return count


def _checker(
    task: ShardCheck,
    labels: list[int],
    add: Callable[[str, int, int], None],
    kept: _Kept,
    groups: set[str],
) -> RecordChecker:
    """The record checker of ``task``'s shard: problems to ``add``, counts in place."""
    return RecordChecker(
        task.schema,
        task.image_feature,
        num_labels=task.num_labels,
        check_sha=task.check_sha,
        decode_images=task.decode_images,
        labels=labels,
        add=add,
        digests=kept.digests,
        record_labels=kept.labels,
        group_by=GroupBy.parse(task.group_by),
        groups=groups,
    )


def _check_inflating(
    held: bytes,
    task: ShardCheck,
    found: _Found,
    labels: list[int],
    kept: _Kept,
    groups: set[str],
) -> int | None:
    """A compressed shard whose bytes match the manifest: its records, checked as it inflates.

    Windows of ``WINDOW_BYTES`` of whole records, as for an uncompressed
    shard, so a stream that inflates to GBs (a 1 MB gzip member of 1 GiB of
    zeros) is never held. A stream that does not inflate is reported before
    the problems of the records read up to there, and its records are not
    counted (None).
    """
    in_records = _Found(task.name, task.max_problems)

    def check(window: memoryview, first: int, offset: int) -> int:
        return _check_window(window, task, in_records, labels, kept, groups, first, offset)

    records: int | None
    try:
        records = check_stream(inflate(held, task.compression), check, in_records.add, WINDOW_BYTES)
    except zlib.error as exc:
        found.add(f"cannot decompress ({task.compression}): {exc}")
        records = None
    found.absorb(in_records)
    return records


def _check_records(
    buf: bytes,
    task: ShardCheck,
    found: _Found,
    labels: list[int],
    kept: _Kept,
    groups: set[str],
) -> int:
    """Every record of a shard held in memory (one that cannot seek, within its manifest size)."""
    # A record takes at least 16 bytes, so a manifest claiming more records cannot inflate this.
    kept.make_room(min(task.records, len(buf) // 16))
    checker = _checker(task, labels, found.add, kept, groups)
    return check_records(buf, checker)
