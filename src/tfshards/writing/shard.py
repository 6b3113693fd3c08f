"""Write one shard: frame its records from a source, hash, index, publish atomically.

The unit of parallel work of :mod:`tfshards.writing.writer`: :func:`write_shard` takes
and returns plain picklable values, so a local process pool or a Dask cluster
runs it unchanged. One writer frames every shard; the way its files become
records is a small source (:mod:`tfshards.writing.sources`,
:mod:`tfshards.writing.features`). A worker imports neither TensorFlow nor
the listing code that walks trees.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import atomicfile, errors, storage
from tfshards.errors import ChangedSinceListingError, InputError, TransformOutputError
from tfshards.format.columns import Column
from tfshards.format.recordbuffer import RecordBuffer
from tfshards.format.schema import FeatureSpec
from tfshards.format.tfrecord import Compressor
from tfshards.listing.entry import Entry
from tfshards.listing.protocol import Rows
from tfshards.run import transform as transforms
from tfshards.shardset import layout, members
from tfshards.shardset.imagestats import ImageStats
from tfshards.shardset.manifest import Reject, ShardInfo, sidecar_from_json, sidecar_json
from tfshards.shardset.resize import Resize
from tfshards.writing import imagestats
from tfshards.writing.features import FeatureFiles, base_specs
from tfshards.writing.fileproblem import MAX_FILE_BYTES, too_large
from tfshards.writing.recordindex import RecordIndex, index_bytes
from tfshards.writing.sources import FetchedFiles, LocalFiles, RecordSource

SKIP_HINT = "; write.on_error: skip leaves such files out"  # ends a content error's line
NAMED = 5  # bad files a failed write names besides the first
FAIL_AFTER = 20  # bad files after which a shard stops under on_error "fail"


@dataclass(frozen=True)
class ShardTask:
    """One shard's work, as plain picklable values (any executor can run it)."""

    name: str
    source: str
    out: str
    rows: Rows  # its files, in record order: entries, or lines of a stored listing read here
    image_feature: str
    transform: str | None
    compression: str
    on_error: str
    source_options: Mapping[str, Any]
    out_options: Mapping[str, Any]
    resize: Resize | None = None  # store each image resized (tfshards.writing.resize)
    bucket: int | None = None  # the split bucket of all its records (tfshards.shardset.buckets)
    exif: str = "ignore"  # tfshards.writing.orientation's mode
    columns: tuple[Column, ...] = ()  # the listing's extra columns: a feature each


@dataclass(frozen=True)
class ShardResult:
    info: ShardInfo
    rejected: tuple[Reject, ...]
    schema: tuple[FeatureSpec, ...]
    reused: bool
    images: ImageStats | None = None  # its images' statistics (tfshards.writing.imagestats)
    rotated: int = 0  # files written here with an EXIF orientation of 2..8 (exif warn, apply)
    # Under on_error "fail": the error of each rejected file, in record order. The shard is
    # written without them (its sidecar lists them: the next run writes it again) and the
    # writer fails after every shard, naming them all, before any manifest.
    failed: tuple[InputError, ...] = ()


def write_shard(task: ShardTask) -> ShardResult:
    """Write one shard (or keep it, if a finished and verified copy exists).

    Its files are renamed into place without an fsync: the caller makes them
    durable (:func:`written_files`, :func:`tfshards.atomicfile.sync_files`)
    before anything counts on them, in one pass for all shards.
    """
    fs_out, out_dir = storage.open_url(task.out, **task.out_options)
    kept = _reuse(fs_out, out_dir, task)
    if kept is not None:
        return kept
    specs = base_specs(task.image_feature)
    specs.update((c.name, c.spec()) for c in task.columns)
    source = _source(task, specs)
    rejects = _Rejects(task.source, task.on_error)
    shard = _ShardFile(fs_out, out_dir, task)
    listed: list[tuple[str, str, int]] = []  # the member list: entries that became records
    try:
        buffer = RecordBuffer(shard.write, task.image_feature)
        for batch in task.rows.batches():
            first = len(rejects.found)
            _frame_batch(source, buffer, batch, rejects)
            left = {r.path for r in rejects.found[first:]}
            listed.extend((e.path, e.token, e.label) for e in batch if e.path not in left)
        buffer.flush()
        shard.commit()
    except OSError as exc:  # reading a file became a reject above: this is the sink's last write
        shard.sink.abort()
        raise storage.write_error(fs_out, shard.path, exc) from None
    except BaseException:
        shard.sink.abort()
        raise
    index_sha = None
    if shard.index is not None:
        index_sha = _write_companion(
            fs_out, layout.index_path(out_dir, task.name), shard.index.to_bytes()
        )
    members_sha = _write_companion(
        fs_out, layout.records_path(out_dir, task.name), members.encode(listed)
    )
    imagestats.save_shard(fs_out, out_dir, task.name, shard.images.stats, durable=False)
    info = ShardInfo(
        task.name,
        len(listed),
        shard.sink.size,
        shard.hasher.hexdigest(),
        index_sha,
        task.bucket,
        members_sha,
    )
    schema = tuple(specs[k] for k in sorted(specs))
    sidecar = layout.sidecar_path(out_dir, task.name)
    try:
        # No fsync: a sidecar lost or cut short by a power cut makes the next run hash the
        # shard in vain and write it again; one that reads must match the shard's sha256.
        atomicfile.write_atomic(
            fs_out,
            sidecar,
            [sidecar_json(info, rejects.found, schema)],
            sync_dir=False,
            durable=False,
        )
    except OSError as exc:
        raise storage.write_error(fs_out, sidecar, exc) from None
    if isinstance(source, FeatureFiles):
        rotated = source.rotated
    else:  # exif warn on the C path: the write pass read each header's orientation
        rotated = shard.images.stats.rotated if task.exif == "warn" else 0
    return ShardResult(
        info,
        tuple(rejects.found),
        schema,
        False,
        shard.images.stats,
        rotated=rotated,
        failed=rejects.failures(),
    )


def written_files(out_dir: str, info: ShardInfo) -> list[str]:
    """The files :func:`write_shard` published for the shard ``info`` describes."""
    files = [storage.join(out_dir, info.name), layout.stats_path(out_dir, info.name)]
    if info.index_sha256 is not None:
        files.append(layout.index_path(out_dir, info.name))
    if info.records_sha256 is not None:
        files.append(layout.records_path(out_dir, info.name))
    return files


def _source(task: ShardTask, specs: dict[str, FeatureSpec]) -> RecordSource:
    """How the task's files become records: transformed, resized or with extra columns
    (Python: the C loop frames the four base features only), local, or fetched."""
    fs_in, root = storage.open_url(task.source, **task.source_options)
    fn = transforms.load(task.transform) if task.transform else None
    if fn is not None or task.resize is not None or task.exif == "apply" or task.columns:
        return FeatureFiles(
            fs_in, root, task.image_feature, task.transform, fn, task.resize, specs, task.exif
        )
    prefix = storage.join(root, "")  # + a listed (relative) path: no join per record
    if storage.is_local(fs_in):  # the hot path: whole buffers
        return LocalFiles(prefix)
    return FetchedFiles(fs_in, prefix)


class _ShardFile:
    """The shard being written: framed bytes in, compressed, hashed, indexed, then committed."""

    def __init__(self, fs: Any, out_dir: str, task: ShardTask) -> None:
        self.fs, self.path = fs, storage.join(out_dir, task.name)
        self.hasher = hashlib.sha256()
        self.compressor = Compressor(task.compression)
        self.index = RecordIndex() if task.compression == "none" else None
        self.images = imagestats.ShardImages(task.image_feature)
        try:
            self.sink = atomicfile.AtomicSink(fs, self.path, temp_dir=layout.work_dir(out_dir))
        except OSError as exc:
            raise storage.write_error(fs, self.path, exc) from None

    def write(self, view: memoryview) -> None:
        """The buffer's flush: whole records, valid only during the call."""
        if self.index is not None:
            self.index.feed(view)
        self.images.feed(view)
        chunks = self.compressor.feed([view])  # the view itself when not compressing
        for chunk in chunks:
            self.hasher.update(chunk)
        try:
            self.sink.write(chunks)
        except OSError as exc:  # not a reject of the file being read: the shard itself fails
            raise storage.write_error(self.fs, self.path, exc) from None

    def commit(self) -> None:
        finished = self.compressor.finish()
        for chunk in finished:
            self.hasher.update(chunk)
        self.sink.write(finished)
        self.sink.commit(sync_dir=False, durable=False)  # the writer syncs them once


@dataclass
class _Rejects:
    """The files left out of a shard; under ``on_error="fail"`` each one's error too (the
    write fails once every shard is done, naming them all: one run finds every bad file)."""

    source: str
    on_error: str
    found: list[Reject] = field(default_factory=list)
    by_path: dict[str, InputError] = field(default_factory=dict)  # errors, under "fail"

    def add(self, exc: OSError | InputError, entry: Entry) -> None:
        if isinstance(exc, (TransformOutputError, errors.StaleListingError)):
            raise _as_input_error(exc, self.source, entry.path) from exc  # never skipped
        if self.on_error == "fail":
            hint = isinstance(exc, InputError) and _is_content(exc)
            self.by_path[entry.path] = _as_input_error(exc, self.source, entry.path, hint)
            if len(self.by_path) >= FAIL_AFTER:  # not a few bad files: a broken transform...
                raise bad_files_error(list(self.by_path.values()), stopped=True)
        # Its bytes as listed were the problem: left out again while they stay so. Not a
        # read error, nor bytes that changed after the listing: the next write reads it.
        token = entry.token if isinstance(exc, InputError) and _is_content(exc) else ""
        self.found.append(Reject(entry.path, _reason(exc), token))

    def failures(self) -> tuple[InputError, ...]:
        """The errors of the files found bad under ``on_error="fail"``, in record order."""
        return tuple(self.by_path[r.path] for r in self.found if r.path in self.by_path)


def bad_files_error(failed: Sequence[InputError], stopped: bool = False) -> InputError:
    """One line for the files that failed a write under ``on_error="fail"``: the first
    one's error (its class, its data) by path, then how many more and the first
    :data:`NAMED` of them; ``stopped``: the shard stopped at :data:`FAIL_AFTER`."""
    ordered = sorted(failed, key=lambda e: str(e.path))  # the listing's order
    first, more = ordered[0], [str(e.path) for e in ordered[1:]]
    hint = SKIP_HINT if any(e.message.endswith(SKIP_HINT) for e in ordered) else ""
    line = first.message.removesuffix(SKIP_HINT)
    if more:
        shown = ", ".join(more[:NAMED]) + (", ..." if len(more) > NAMED else "")
        line += f"; {len(more)} more file{'s' if len(more) != 1 else ''} failed too: {shown}"
    if stopped:
        line += f" (a shard stopped at {FAIL_AFTER} bad files: there may be more)"
    attrs = {k: v for k, v in vars(first).items() if k != "message"}
    return type(first)(line + hint, **attrs)


def _frame_batch(
    source: RecordSource, buffer: RecordBuffer, batch: Sequence[Entry], rejects: _Rejects
) -> None:
    """Frame one batch of entries; its rejects in listing order, whatever found them first."""
    first = len(rejects.found)
    entries = batch
    if any(entry.size > MAX_FILE_BYTES for entry in batch):
        for entry in batch:
            if entry.size > MAX_FILE_BYTES:
                rejects.add(too_large(entry.path, entry.size), entry)
        entries = [entry for entry in batch if entry.size <= MAX_FILE_BYTES]
    for entry, problem in source.frame(buffer, entries):
        rejects.add(problem, entry)
    if len(entries) < len(batch):
        order = {entry.path: i for i, entry in enumerate(batch)}
        rejects.found[first:] = sorted(rejects.found[first:], key=lambda r: order[r.path])


def _is_content(exc: InputError) -> bool:
    """A problem of the file's bytes as listed (not bytes that changed after the listing)."""
    return not isinstance(exc, ChangedSinceListingError)


def _as_input_error(exc: Exception, source: str, rel: str, hint: bool = False) -> InputError:
    """Re-raise a per-file problem with the file's full location in front; ``hint``: say
    how to write the set without such files."""
    where = storage.join(source, rel)
    if isinstance(exc, InputError):
        skip = SKIP_HINT if hint else ""
        return type(exc)(f"{where}: {_reason(exc)}{skip}", **{**_attrs(exc), "path": rel})
    return InputError(f"{where}: cannot read: {_reason(exc)}", path=rel)


def _attrs(exc: Exception) -> dict[str, Any]:
    return {k: v for k, v in vars(exc).items() if k not in ("message", "path")}


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"{exc.strerror or type(exc).__name__}"
    text = str(exc)
    path = getattr(exc, "path", None)
    prefix = f"{path}: "
    return text[len(prefix) :] if path and text.startswith(prefix) else text


def _write_companion(fs: Any, path: str, data: bytes) -> str:
    """Publish a shard's companion file (record index, member list), not yet durable;
    its sha256."""
    try:
        atomicfile.write_atomic(fs, path, [data], sync_dir=False, durable=False)
    except OSError as exc:
        raise storage.write_error(fs, path, exc) from None
    return hashlib.sha256(data).hexdigest()


def _companion_holds(fs: Any, path: str, sha256: str | None) -> bool:
    """Whether the companion at ``path`` is there with the sha256 its sidecar records."""
    try:
        data = storage.read_bytes(fs, path)
    except OSError:
        return False
    return sha256 is not None and hashlib.sha256(data).hexdigest() == sha256


def _reuse(fs: Any, out_dir: str, task: ShardTask) -> ShardResult | None:
    """A finished shard whose bytes still match its sidecar, or None.

    Its index file is derived again from the bytes just hashed, and written
    again when missing or not those bytes (a sidecar from before index files
    records none).
    """
    try:
        sidecar = storage.read_bytes(fs, layout.sidecar_path(out_dir, task.name))
        info, rejected, schema = sidecar_from_json(sidecar)
        data = storage.read_bytes(fs, storage.join(out_dir, task.name))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    if len(data) != info.bytes or hashlib.sha256(data).hexdigest() != info.sha256:
        return None
    if rejected:  # written with files left out: read them again (a reject may be transient,
        return None  # and under on_error "fail" one that persists must fail the write)
    if info.bucket != task.bucket or not _companion_holds(
        fs, layout.records_path(out_dir, task.name), info.records_sha256
    ):
        return None
    index_sha = None
    if task.compression == "none":
        try:
            index = index_bytes(data)
        except ValueError:  # framing cut short: the bytes hashed are not a shard this writes
            return None
        index_sha = hashlib.sha256(index).hexdigest()
        try:
            current = storage.read_bytes(fs, layout.index_path(out_dir, task.name))
        except OSError:
            current = None
        if current != index:
            _write_companion(fs, layout.index_path(out_dir, task.name), index)
    info = dataclasses.replace(info, index_sha256=index_sha)
    images = imagestats.of_shard(data, task.compression, task.image_feature)
    imagestats.save_shard(fs, out_dir, task.name, images, durable=False)
    return ShardResult(info, rejected, schema, True, images)
