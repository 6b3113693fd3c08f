"""Check a shard set against its manifest: file bytes, framing, records, labels, leftovers.

Each shard is one task (:func:`validate_shard`) on plain values, run on any
executor. Nothing stops at the first problem: every problem is counted, and
the first ``max_problems`` of each shard kept, with where it is (shard,
record index, byte offset; offsets count in the decompressed stream for
gzip/zlib shards) and what was expected and found. Memory does not grow with
what a shard holds (see :func:`validate_shard`).
The records themselves are checked by :func:`tfshards.bulkcheck.check_records`
(numpy, all records of a shard at once) and :mod:`tfshards.recordcheck`.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import bulkcheck, layout, native, storage
from tfshards import executor as executors
from tfshards.bulkcheck import check_records
from tfshards.errors import ConfigError, ValidationError
from tfshards.example import FeatureSpec
from tfshards.manifest import Manifest, ShardInfo, load
from tfshards.progress import Progress
from tfshards.recordcheck import RecordChecker
from tfshards.tfrecord import FrameCounter, decompress, inflate

MAX_PROBLEMS = 50  # kept per shard, and printed: enough to see a pattern, few enough to read


@dataclass(frozen=True)
class ValidateConfig:
    """What to check and how; validated on construction.

    Attributes:
        manifest: URL of the ``manifest.json`` to check (its ``root`` locates the shards).
        decode_images: also decode every image payload with Pillow (slow: ~0.1-1.5 ms each).
        workers: shards checked at once (with processes, this process works too).
        executor: ``auto``, ``process``, ``thread``, ``serial`` or ``dask``.
            ``auto`` means threads when :mod:`tfshards.native` is built and the
            schema takes the bulk path (every per-record loop then runs without
            the GIL), else processes; threads for ``memory://``.
        dask_address: scheduler address for ``executor="dask"`` (None: a local cluster).
        max_problems: problems kept per shard (all are counted).
        storage_options: fsspec options for the manifest and the shards.
    """

    manifest: str
    decode_images: bool = False
    workers: int = 1
    executor: str = "auto"
    dask_address: str | None = None
    max_problems: int = MAX_PROBLEMS
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_problems < 1:
            raise ConfigError(f"max_problems must be >= 1, got {self.max_problems}")
        executors.check_options(self.executor, self.workers)


@dataclass(frozen=True)
class Problem:
    """One thing wrong: in file ``where``, at record ``index`` (byte ``offset``) if any."""

    where: str
    what: str
    index: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        if self.index is None:
            return f"{self.where}: {self.what}"
        return f"{self.where}: record {self.index} at byte {self.offset}: {self.what}"


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
        """The check of ``shard`` as the manifest describes it (at ``path``, if given)."""
        where = path or storage.join(manifest.root, shard.name)
        return cls(
            root=posixpath.dirname(where),
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


@dataclass(frozen=True)
class ValidationReport:
    """The result of :func:`validate`; ``ok`` when no problem was found."""

    manifest: Manifest
    records: int
    bytes: int
    records_per_label: Mapping[str, int]
    problems: tuple[Problem, ...]  # in manifest order; at most ``max_problems`` per file
    problem_count: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def metrics(self) -> dict[str, Any]:
        """Byte-stable metrics for DVC (no timings)."""
        return {
            "bytes": self.bytes,
            "ok": self.ok,
            "problems": self.problem_count,
            "records": self.records,
            "records_per_label": dict(self.records_per_label),
            "rejected_inputs": len(self.manifest.rejected),
            "shards": len(self.manifest.shards),
        }

    def summary(self) -> str:
        m = self.manifest
        n = self.problem_count
        verdict = "OK" if self.ok else f"{n} problem{'s' if n != 1 else ''}"
        return (
            f"validated {self.records} records in {len(m.shards)} shards "
            f"({self.bytes / 1e6:.1f} MB) in {self.seconds:.1f} s: {verdict}"
        )

    def raise_for_problems(self) -> None:
        """Raise :class:`ValidationError` (``problems``: each line) unless ``ok``."""
        if not self.ok:
            raise ValidationError(
                f"{self.summary()} in {self.manifest.root}",
                problems=[str(p) for p in self.problems],
                problem_count=self.problem_count,
            )


# ----------------------------------------------------------------------------- worker


class _Found:
    """Problems of one file: keeps the first ``limit``, counts all."""

    def __init__(self, where: str, limit: int) -> None:
        self.where, self.limit, self.count = where, limit, 0
        self.kept: list[Problem] = []

    def add(self, what: str, index: int | None = None, offset: int | None = None) -> None:
        self.count += 1
        if len(self.kept) < self.limit:
            self.kept.append(Problem(self.where, what, index, offset))

    def skip(self, n: int) -> None:
        """``n`` more problems, found past the limit and not kept."""
        self.count += n


def validate_shard(task: ShardCheck) -> ShardReport:
    """Check one shard's bytes, framing and records against its manifest entry.

    Memory stays bounded by the manifest's shard size whatever the file holds
    (measured in the README): a file larger than the manifest says is hashed
    and its framing walked in pieces, and a gzip/zlib shard is decompressed
    whole only when its size and sha256 match the manifest; otherwise its
    stream is inflated piece by piece and only its framing is walked.
    """
    found = _Found(task.name, task.max_problems)
    labels = [0] * task.num_labels
    fs, root = storage.open_url(task.root, **task.storage_options)
    try:
        with fs.open(storage.join(root, task.name), "rb") as f:
            read = _Read(f, task.bytes + HOLD_SLACK)
            records = _check_read(read, task, found, labels)
    except FileNotFoundError:
        found.add(f"missing: expected {task.bytes} bytes holding {task.records} records")
        return ShardReport(task.name, 0, 0, tuple(labels), tuple(found.kept), found.count)
    except OSError as exc:
        found.add(f"cannot read: {exc.strerror or exc}")
        return ShardReport(task.name, 0, 0, tuple(labels), tuple(found.kept), found.count)
    if records is not None and records != task.records:
        found.add(f"record count mismatch: expected {task.records}, found {records}")
    return ShardReport(
        task.name, records or 0, read.size, tuple(labels), tuple(found.kept), found.count
    )


READ_CHUNK = 4 << 20  # hashed and walked at a time past what is held
HOLD_SLACK = 1 << 20  # bytes held past the manifest's size: a few appended bytes still get parsed


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


def _check_read(read: _Read, task: ShardCheck, found: _Found, labels: list[int]) -> int | None:
    """Report the file's size and hash, then its records; how many records (None: unknown)."""
    if read.fits:
        _compare_file(read, task, found)
        if task.compression == "none" or (read.size, read.sha256) == (task.bytes, task.sha256):
            held, read.held = read.held, b""  # the records check owns it (and may let it go)
            return _check_held(held, task, found, labels)
        pieces: Iterator[bytes] = iter([read.held])
    else:
        pieces = read.rest()
    # Untrusted and compressed, or too large to hold: inflate and walk the framing in pieces.
    records, problem = None, None
    try:
        walk = _walk(pieces if task.compression == "none" else inflate(pieces, task.compression))
    except zlib.error as exc:
        problem = f"cannot decompress ({task.compression}): {exc}"
    else:
        records = walk.records
    for _ in pieces:  # hash what the walk left
        pass
    if not read.fits:
        _compare_file(read, task, found)
    if problem is not None:
        found.add(problem)
    elif walk.problem is not None:
        found.add(walk.problem, walk.records, walk.offset)
    return records


def _compare_file(read: _Read, task: ShardCheck, found: _Found) -> None:
    if read.size != task.bytes:
        found.add(f"size mismatch: expected {task.bytes} bytes, found {read.size}")
    if read.sha256 != task.sha256:
        found.add(f"sha256 mismatch: expected {task.sha256}, found {read.sha256}")


def _check_held(held: bytes, task: ShardCheck, found: _Found, labels: list[int]) -> int | None:
    """Every record of a shard held in memory (decompressed whole: it matched the manifest)."""
    try:
        buf = decompress(held, task.compression)
    except zlib.error as exc:
        found.add(f"cannot decompress ({task.compression}): {exc}")
        return None
    del held
    checker = RecordChecker(
        task.schema,
        task.image_feature,
        num_labels=task.num_labels,
        check_sha=task.check_sha,
        decode_images=task.decode_images,
        labels=labels,
        add=found.add,
        limit=task.max_problems,
        skip=found.skip,
    )
    return check_records(buf, checker)


def _walk(pieces: Iterable[bytes]) -> FrameCounter:
    """Walk the framing of a stream given in pieces, stopping at its first problem."""
    walk = FrameCounter()
    for piece in pieces:
        walk.feed(piece)
        if walk.problem is not None:
            return walk
    walk.finish()
    return walk


# ----------------------------------------------------------------------------- run


def validate(config: ValidateConfig, *, progress: bool = False) -> ValidationReport:
    """Check every shard the manifest at ``config.manifest`` lists, and its version directory.

    Never stops at the first problem; see :class:`ValidationReport` for what
    comes back. Raises only when the manifest itself cannot be read
    (:class:`~tfshards.errors.InputError`) or the config is impossible.
    """
    start = time.monotonic()
    manifest = load(config.manifest, **config.storage_options)
    fs, root = storage.open_url(manifest.root, **config.storage_options)
    gil_free = native.NATIVE is not None and bulkcheck.supports(
        manifest.schema, config.decode_images
    )
    kind = executors.resolve(
        config.executor, config.workers, [storage.protocol(fs)], gil_free=gil_free
    )
    tasks = [
        ShardCheck.of(
            manifest,
            shard,
            decode_images=config.decode_images,
            max_problems=config.max_problems,
            storage_options=config.storage_options,
        )
        for shard in manifest.shards
    ]
    with Progress("validate", total=manifest.records, enabled=progress) as bar:
        done = executors.in_order(
            executors.run(
                validate_shard,
                tasks,
                executor=kind,
                workers=config.workers,
                dask_address=config.dask_address,
                describe=lambda t: t.name,
            ),
            len(tasks),
            on_result=lambda r: bar.update(r.records, r.bytes),
        )
    problems = [p for r in done for p in r.problems]
    count = sum(r.problem_count for r in done)
    extra = _manifest_problems(manifest, config.manifest, done)
    extra += unlisted_files(fs, root, manifest)
    per_label = [sum(r.label_counts[i] for r in done) for i in range(len(manifest.labels))]
    return ValidationReport(
        manifest=manifest,
        records=sum(r.records for r in done),
        bytes=sum(r.bytes for r in done),
        records_per_label=dict(zip(manifest.labels, per_label, strict=True)),
        problems=tuple(problems + extra[: config.max_problems]),
        problem_count=count + len(extra),
        seconds=time.monotonic() - start,
    )


def _manifest_problems(
    manifest: Manifest, source: str, reports: Sequence[ShardReport]
) -> list[Problem]:
    """Totals that disagree: records found in all, and the manifest's own accounting."""
    where = posixpath.basename(source.rstrip("/")) or source
    out = []
    found = sum(r.records for r in reports)
    if found != manifest.records:
        out.append(
            Problem(
                where, f"total record count mismatch: expected {manifest.records}, found {found}"
            )
        )
    if manifest.listed != manifest.records + len(manifest.rejected):
        out.append(
            Problem(
                where,
                f"inputs do not add up: expected {manifest.listed} listed = records + rejected, "
                f"found {manifest.records} + {len(manifest.rejected)}",
            )
        )
    return out


def unlisted_files(fs: Any, root: str, manifest: Manifest) -> list[Problem]:
    """Files in the version directory that the manifest does not account for.

    What may be there is declared once, in :mod:`tfshards.layout` (the
    manifest, the shards and their bookkeeping files in its subfolders); a
    temp file of :class:`~tfshards.storage.AtomicSink` is reported as stale.
    """
    try:
        entries = fs.find(root, withdirs=True, detail=True)
    except FileNotFoundError:
        return []  # every shard reports itself missing
    expected = layout.expected_paths(s.name for s in manifest.shards)
    base = root.rstrip("/") + "/"
    out = []
    foreign: list[str] = []  # unexpected folders: reported once, not file by file
    for name in sorted(entries):
        if not str(name).startswith(base):
            continue  # the version directory itself
        rel = str(name)[len(base) :].rstrip("/")
        if not rel or rel in expected or rel in layout.FOLDERS:
            continue
        if any(rel.startswith(folder) for folder in foreign):
            continue
        if storage.is_temp_name(posixpath.basename(rel)):
            what = "stale temp file (a writer stopped before publishing it)"
        elif entries[name].get("type") == "directory":
            what = "directory not listed in the manifest"
            foreign.append(rel + "/")
        else:
            what = "file not listed in the manifest"
        out.append(Problem(rel, what))
    return out


def write_metrics(report: ValidationReport, url: str) -> None:
    """Save :meth:`ValidationReport.metrics` as sorted, indented JSON (byte-stable)."""
    fs, path = storage.open_url(url)
    text = json.dumps(report.metrics(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    storage.write_atomic(fs, path, [text.encode()])
