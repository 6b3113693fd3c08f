"""Check a shard set against its manifest: file bytes, framing, records, labels, leftovers.

Each shard is one task (:func:`validate_shard`) on plain values, run on any
executor. Nothing stops at the first problem: every problem is collected with
where it is (shard, record index, byte offset; offsets count in the
decompressed stream for gzip/zlib shards) and what was expected and found.

Records take a fast path (``_Plan.check``, ~3 us for four features where
``example.decode`` + ``conformance_problem`` take ~20) that walks the canonical
layout :func:`tfshards.example.encode` writes, with int indexing on the shard
bytes and no lists built. A record it does not accept goes through the general
decoder, which decides and words the problem, so both paths accept the same
records and report the same words.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
import struct
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import crc32c

from tfshards import executor as executors
from tfshards import storage
from tfshards import tfrecord as tfr
from tfshards.errors import ConfigError, ValidationError
from tfshards.example import DecodeError, FeatureSpec, conformance_problem, decode
from tfshards.manifest import MANIFEST_NAME, SIDECAR_SUFFIX, Manifest, load
from tfshards.progress import Progress
from tfshards.tfrecord import FOOTER_BYTES, HEADER_BYTES, decompress

# Below this much shard data, executor "auto" checks on threads, not processes: starting
# a forkserver pool cost 0.5-1.5 s here (its workers import tfshards and numpy), which
# is more than a second core saves on < 1 GB at ~0.3-0.5 GB/s per core. Threads still
# overlap the hashing and reading, which release the GIL.
PROCESS_MIN_BYTES = 1 << 30
MAX_PROBLEMS = 50  # kept per shard, and printed: enough to see a pattern, few enough to read


@dataclass(frozen=True)
class ValidateConfig:
    """What to check and how; validated on construction.

    Attributes:
        manifest: URL of the ``manifest.json`` to check (its ``root`` locates the shards).
        decode_images: also decode every image payload with Pillow (slow: ~0.1-1.5 ms each).
        workers: parallel shard checkers.
        executor: ``auto`` (threads below :data:`PROCESS_MIN_BYTES` of shards, else
            processes), ``process``, ``thread``, ``serial`` or ``dask``.
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
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.max_problems < 1:
            raise ConfigError(f"max_problems must be >= 1, got {self.max_problems}")
        if self.executor not in executors.EXECUTORS:
            raise ConfigError(
                f"executor must be one of {executors.EXECUTORS}, got {self.executor!r}"
            )


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


def validate_shard(task: ShardCheck) -> ShardReport:
    """Check one shard's bytes, framing and records against its manifest entry."""
    found = _Found(task.name, task.max_problems)
    labels = [0] * task.num_labels
    records = nbytes = 0
    fs, root = storage.open_url(task.root, **task.storage_options)
    try:
        raw = storage.read_bytes(fs, storage.join(root, task.name))
    except FileNotFoundError:
        found.add(f"missing: expected {task.bytes} bytes holding {task.records} records")
        raw = None
    except OSError as exc:
        found.add(f"cannot read: {exc.strerror or exc}")
        raw = None
    if raw is not None:
        nbytes = len(raw)
        if nbytes != task.bytes:
            found.add(f"size mismatch: expected {task.bytes} bytes, found {nbytes}")
        digest = hashlib.sha256(raw).hexdigest()
        if digest != task.sha256:
            found.add(f"sha256 mismatch: expected {task.sha256}, found {digest}")
        try:
            buf = decompress(raw, task.compression)
        except zlib.error as exc:
            found.add(f"cannot decompress ({task.compression}): {exc}")
        else:
            del raw
            records = _check_records(buf, task, found, labels)
            if records != task.records:
                found.add(f"record count mismatch: expected {task.records}, found {records}")
    return ShardReport(task.name, records, nbytes, tuple(labels), tuple(found.kept), found.count)


def _check_records(buf: bytes, task: ShardCheck, found: _Found, labels: list[int]) -> int:
    """Scan every record of ``buf``; returns how many records the framing holds."""
    plan = _Plan.build(task.schema, task.image_feature)
    has_image = _scalar(task.schema, task.image_feature, "bytes")
    check_sha = task.check_sha and has_image and _scalar(task.schema, "sha256", "bytes")
    decode_images = task.decode_images and has_image
    count_labels = _scalar(task.schema, "label", "int64")
    num_labels = task.num_labels
    view = memoryview(buf)
    check, sha256 = plan.check, hashlib.sha256  # locals: this loop runs ~100k times a second
    records = 0
    for index, offset, start, end, problem in _frames(buf):
        if problem is not None:
            found.add(problem, index, offset)
            if start < 0:  # the framing cannot be trusted past here
                break
            records += 1  # a data CRC problem: the bytes are damaged, parsing says no more
            continue
        records += 1
        checked = check(buf, start, end)
        if checked is None:  # not the canonical layout: the general decoder decides, and says why
            slow = _check_slow(view[start:end], task.schema, task.image_feature)
            if isinstance(slow, str):
                found.add(slow, index, offset)
                continue
            label, payload, stored = slow
        else:
            label, ps, pe, ss, se = checked
            payload, stored = view[ps:pe], buf[ss:se]
        if count_labels:
            if 0 <= label < num_labels:
                labels[label] += 1
            else:
                found.add(
                    f"label out of range: expected 0..{num_labels - 1} "
                    f"({num_labels} labels), found {label}",
                    index,
                    offset,
                )
        if check_sha:
            digest = sha256(payload).hexdigest().encode()
            if digest != stored:
                found.add(
                    f"feature 'sha256' does not match the sha256 of feature "
                    f"{task.image_feature!r}: expected {digest.decode()}, "
                    f"found {bytes(stored).decode('ascii', 'backslashreplace')}",
                    index,
                    offset,
                )
        if decode_images:
            why = _undecodable(payload)
            if why is not None:
                found.add(
                    f"feature {task.image_feature!r} does not decode as an image: {why}",
                    index,
                    offset,
                )
    return records


def _frames(buf: bytes) -> Iterator[tuple[int, int, int, int, str | None]]:
    """``(index, offset, data start, data end, problem)`` of each record in ``buf``.

    :func:`tfshards.tfrecord.scan`'s checks without its per-record objects
    (~1 us less per record); from the first problem on, ``scan`` itself takes
    over, so problems are found and worded in one place. A framing problem
    has start -1 and ends the records.
    """
    view = memoryview(buf)
    size = len(buf)
    offset = index = 0
    header, footer, crc, mask = _HEADER.unpack_from, _FOOTER.unpack_from, crc32c.crc32c, tfr.mask
    while size - offset >= HEADER_BYTES + FOOTER_BYTES:
        length, length_crc = header(buf, offset)
        start = offset + HEADER_BYTES
        end = start + length
        if (
            end + FOOTER_BYTES > size
            or mask(crc(view[offset : offset + 8])) != length_crc
            or mask(crc(view[start:end])) != footer(buf, end)[0]
        ):
            break
        yield index, offset, start, end, None
        offset = end + FOOTER_BYTES
        index += 1
    if offset < size:
        for i, at, data, problem in tfr.scan(view[offset:]):
            start = -1 if data is None else offset + at + HEADER_BYTES
            yield index + i, offset + at, start, start + len(data or b""), problem


def _scalar(schema: Sequence[FeatureSpec], name: str, dtype: str) -> bool:
    return any(s.name == name and s.dtype == dtype and s.size == 1 for s in schema)


def _check_slow(
    data: memoryview, schema: Sequence[FeatureSpec], image_feature: str
) -> str | tuple[int, Any, Any]:
    """The general path: a problem, or ``(label, payload, stored sha256)`` of a good record."""
    try:
        decoded = decode(data)
    except (DecodeError, UnicodeDecodeError) as exc:
        return f"not a tf.train.Example: {exc}"
    problem = conformance_problem(decoded, schema)
    if problem is not None:
        return problem

    def first(name: str, default: Any) -> Any:
        values = decoded.get(name, ("bytes", []))[1]
        return values[0] if len(values) == 1 else default

    return first("label", 0), first(image_feature, b""), first("sha256", b"")


def _undecodable(payload: Any) -> str | None:
    """Why Pillow cannot decode ``payload``, or None when it can."""
    from PIL import Image  # only with --decode

    try:
        with Image.open(io.BytesIO(payload)) as img:
            img.load()
    # What Pillow raises for bad image bytes; anything else is a bug and propagates.
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# ----------------------------------------------------------------------------- fast path
_HEADER = struct.Struct("<QI")  # TFRecord: length, masked crc32c of the length
_FOOTER = struct.Struct("<I")  # masked crc32c of the data
_TAG1 = 0x0A  # field 1, length-delimited: Example.features, map entry, key, each list
_KIND_TAG = {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}  # Feature's oneof fields 1, 2, 3
_OTHER, _PAYLOAD, _STORED, _LABEL = range(4)  # what a feature is to the record checks
_TOO_LONG = 1 << 64  # a length no record has, so every bounds check after it fails
_LONG_VARINT = re.compile(rb"[\x80-\xff]{10}")  # example.decode rejects varints over 10 bytes
_HIGH_BYTES = bytes(range(0x80, 0x100))


def _more(b: bytes, pos: int, x: int) -> tuple[int, int]:
    """Finish a varint whose first byte ``x`` (>= 0x80) ends just before ``pos``.

    Returns ``(value, next position)``, or :data:`_TOO_LONG` past 10 bytes.
    Callers read one-byte varints inline: a call costs more than the decoding.
    """
    result, shift = x & 0x7F, 7
    while shift < 70:
        x = b[pos]
        pos += 1
        result |= (x & 0x7F) << shift
        if x < 0x80:
            return result, pos
        shift += 7
    return _TOO_LONG, pos


@dataclass(frozen=True)
class _Plan:
    """The schema, laid out as :func:`tfshards.example.encode` writes it (keys sorted).

    ``specs`` holds per feature: the bytes that open its map entry's key
    field and its ``Feature`` tag (``0x0A len key 0x12``) and their length,
    its list kind tag, its size (-1: varies), its role in the record checks,
    and whether it is a single bytes value (the common case, unrolled).
    """

    specs: tuple[tuple[bytes, int, int, int, int, bool], ...]

    @classmethod
    def build(cls, schema: Sequence[FeatureSpec], image_feature: str) -> _Plan:
        roles = {(image_feature, "bytes"): _PAYLOAD, ("sha256", "bytes"): _STORED}
        roles[("label", "int64")] = _LABEL
        specs = []
        for s in schema:
            key = s.name.encode()
            if len(key) >= 0x80:  # a two-byte key length: leave such rare schemas to decode
                return cls(())
            role = roles.get((s.name, s.dtype), _OTHER) if s.size == 1 else _OTHER
            head = bytes([_TAG1, len(key)]) + key + b"\x12"  # key field, then Feature's tag
            size = -1 if s.size is None else s.size
            scalar_bytes = size == 1 and s.dtype == "bytes"
            specs.append((key, (head, len(head), _KIND_TAG[s.dtype], size, role, scalar_bytes)))
        return cls(tuple(spec for _, spec in sorted(specs)))

    def check(self, b: bytes, pos: int, end: int) -> tuple[int, int, int, int, int] | None:
        """``(label, payload start, payload end, sha256 start, sha256 end)`` of ``b[pos:end]``.

        Returns them only for an Example in the canonical layout that conforms
        to the schema; None for anything else (the general path then decides,
        and words any problem as :func:`conformance_problem` does). Each length
        is checked against its enclosing end before use, so bytes past ``end``
        never count.
        """
        if not self.specs:
            return None
        label = ps = pe = ss = se = first = first_end = 0
        try:
            if b[pos] != _TAG1:
                return None
            n = b[pos + 1]
            pos += 2
            if n > 0x7F:
                n, pos = _more(b, pos, n)
            if pos + n != end:
                return None
            for head, head_len, tag, size, role, scalar_bytes in self.specs:
                if b[pos] != _TAG1:
                    return None
                n = b[pos + 1]
                pos += 2
                if n > 0x7F:
                    n, pos = _more(b, pos, n)
                entry_end = pos + n
                if entry_end > end or not b.startswith(head, pos, entry_end):
                    return None
                pos += head_len  # key field and the Feature's tag; now the Feature's length
                n = b[pos]
                pos += 1
                if n > 0x7F:
                    n, pos = _more(b, pos, n)
                if pos + n != entry_end or not n or b[pos] != tag:
                    return None  # (an empty Feature, or a list kind the schema does not say)
                n = b[pos + 1]
                pos += 2
                if n > 0x7F:
                    n, pos = _more(b, pos, n)
                if pos + n != entry_end:
                    return None
                count = 0
                if scalar_bytes:  # the common case, unrolled: exactly one {1: bytes}
                    if b[pos] != _TAG1:
                        return None
                    n = b[pos + 1]
                    pos += 2
                    if n > 0x7F:
                        n, pos = _more(b, pos, n)
                    if pos + n != entry_end:
                        return None
                    if role == _PAYLOAD:
                        ps, pe = pos, entry_end
                    elif role == _STORED:
                        ss, se = pos, entry_end
                    pos = entry_end
                    continue
                if tag == _TAG1:  # BytesList: repeated {1: bytes}
                    while pos < entry_end:
                        if b[pos] != _TAG1:
                            return None
                        n = b[pos + 1]
                        pos += 2
                        if n > 0x7F:
                            n, pos = _more(b, pos, n)
                        if not count:
                            first, first_end = pos, pos + n
                        pos += n
                        count += 1
                    if pos != entry_end:
                        return None
                    if role == _PAYLOAD:
                        ps, pe = first, first_end
                    elif role == _STORED:
                        ss, se = first, first_end
                elif pos < entry_end:  # FloatList or Int64List: {1: packed}
                    if b[pos] != _TAG1:
                        return None
                    n = b[pos + 1]
                    pos += 2
                    if n > 0x7F:
                        n, pos = _more(b, pos, n)
                    if pos + n != entry_end:
                        return None
                    if tag == 0x12:
                        if n % 4:
                            return None
                        count = n // 4
                    else:
                        count = len(b[pos:entry_end].translate(None, _HIGH_BYTES))
                        # Some varints take several bytes: the last must end, none run long.
                        if count < n and (
                            b[entry_end - 1] > 0x7F or _LONG_VARINT.search(b, pos, entry_end)
                        ):
                            return None
                        if role == _LABEL:
                            label = b[pos]
                            if label > 0x7F:
                                label = _more(b, pos + 1, label)[0]
                            if label >= 1 << 63:
                                label -= 1 << 64
                if size >= 0 and count != size:
                    return None
                pos = entry_end
        except IndexError:
            return None
        if pos != end:
            return None  # features the schema does not name
        return label, ps, pe, ss, se


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
    kind = config.executor
    if kind == "auto" and config.workers > 1 and manifest.bytes < PROCESS_MIN_BYTES:
        kind = "thread"
    kind = executors.resolve(kind, config.workers, [storage.protocol(fs)])
    image = str(manifest.params.get("image_feature", "image"))
    # A transform may replace the payload; the stored sha256 is of the original file.
    check_sha = manifest.params.get("transform") == "none"
    tasks = [
        ShardCheck(
            root=manifest.root,
            name=shard.name,
            records=shard.records,
            bytes=shard.bytes,
            sha256=shard.sha256,
            compression=manifest.compression,
            schema=manifest.schema,
            num_labels=len(manifest.labels),
            image_feature=image,
            check_sha=check_sha,
            decode_images=config.decode_images,
            max_problems=config.max_problems,
            storage_options=dict(config.storage_options),
        )
        for shard in manifest.shards
    ]
    reports: list[ShardReport | None] = [None] * len(tasks)
    with Progress("validate", total=manifest.records, enabled=progress) as bar:
        for i, report in executors.run(
            validate_shard,
            tasks,
            executor=kind,
            workers=config.workers,
            dask_address=config.dask_address,
            describe=lambda t: t.name,
        ):
            reports[i] = report
            bar.update(report.records, report.bytes)
    done = [r for r in reports if r is not None]
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

    ``manifest.json`` and the ``.done`` sidecars of listed shards belong there;
    a temp file of :class:`~tfshards.storage.AtomicSink` is reported as stale.
    """
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return []  # every shard reports itself missing
    listed = {s.name for s in manifest.shards}
    expected = listed | {n + SIDECAR_SUFFIX for n in listed} | {MANIFEST_NAME}
    out = []
    for entry in sorted(entries, key=lambda e: str(e["name"])):
        name = posixpath.basename(str(entry["name"]).rstrip("/"))
        if name in expected:
            continue
        if storage.is_temp_name(name):
            what = "stale temp file (a writer stopped before publishing it)"
        elif entry.get("type") == "directory":
            what = "directory not listed in the manifest"
        else:
            what = "file not listed in the manifest"
        out.append(Problem(name, what))
    return out


def write_metrics(report: ValidationReport, url: str) -> None:
    """Save :meth:`ValidationReport.metrics` as sorted, indented JSON (byte-stable)."""
    fs, path = storage.open_url(url)
    text = json.dumps(report.metrics(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    storage.write_atomic(fs, path, [text.encode()])
