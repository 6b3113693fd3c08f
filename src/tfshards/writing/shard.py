"""Write one shard: read its files, encode Examples, frame, hash, index, publish atomically.

The unit of parallel work of :mod:`tfshards.writing.writer`: :func:`write_shard` takes
and returns plain picklable values, so a local process pool or a Dask cluster
runs it unchanged. A worker imports neither TensorFlow nor the listing code.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import errors, storage
from tfshards.errors import InputError, TransformError, TransformOutputError
from tfshards.format.example import encode
from tfshards.format.imageformat import (
    HEAD_BYTES,
    NotAnImage,
    claims_image,
    image_format,
    not_an_image,
)
from tfshards.format.recordbuffer import (
    ContentChanged,
    FileChanged,
    ReadInto,
    RecordBuffer,
    copy_into,
)
from tfshards.format.schema import FeatureSpec, Values, merge_specs, normalize
from tfshards.format.tfrecord import Compressor, frame
from tfshards.format.wire import Dtype
from tfshards.listing.contenthash import expected_md5, expected_sha256
from tfshards.listing.hashcache import stale_listing
from tfshards.listing.storedlisting import ListedRows
from tfshards.run import transform as transforms
from tfshards.shardset import layout
from tfshards.shardset.manifest import Reject, ShardInfo, sidecar_from_json, sidecar_json
from tfshards.shardset.resize import Resize
from tfshards.writing.recordindex import RecordIndex, index_bytes
from tfshards.writing.resize import resize_image

# A file larger than this is refused before it is read: a worker holds one
# whole file while framing it, and TensorFlow cannot parse an Example of 2 GiB
# or more (protobuf's message limit), so such a record could never be read.
MAX_FILE_BYTES = 1 << 30


@dataclass(frozen=True)
class ShardTask:
    """One shard's work, as plain picklable values (any executor can run it)."""

    name: str
    source: str
    out: str
    entries: tuple[tuple[str, int, int], ...]  # (relative path, label index, listed size)
    image_feature: str
    transform: str | None
    compression: str
    on_error: str
    source_options: Mapping[str, Any]
    out_options: Mapping[str, Any]
    tokens: tuple[str, ...] = ()  # each entry's listed content token (tfshards.listing.contenthash)
    listed: ListedRows | None = None  # instead of entries/tokens: lines read here, in batches
    resize: Resize | None = (
        None  # store each image resized (tfshards.writing.resize), not as listed
    )


@dataclass(frozen=True)
class ShardResult:
    info: ShardInfo
    rejected: tuple[Reject, ...]
    schema: tuple[FeatureSpec, ...]
    reused: bool


def write_shard(task: ShardTask) -> ShardResult:
    """Write one shard (or keep it, if a finished and verified copy exists)."""
    fs_out, out_dir = storage.open_url(task.out, **task.out_options)
    shard_path = storage.join(out_dir, task.name)
    kept = _reuse(fs_out, out_dir, task)
    if kept is not None:
        return kept
    fs_in, root = storage.open_url(task.source, **task.source_options)
    fn = transforms.load(task.transform) if task.transform else None
    specs = {
        task.image_feature: FeatureSpec(task.image_feature, "bytes", ()),
        "label": FeatureSpec("label", "int64", ()),
        "path": FeatureSpec("path", "bytes", ()),
        "sha256": FeatureSpec("sha256", "bytes", ()),
    }
    keys = _Keys()
    rejected: list[Reject] = []
    hasher = hashlib.sha256()
    compressor = Compressor(task.compression)
    index = RecordIndex() if task.compression == "none" else None

    def flush(view: memoryview) -> None:
        if index is not None:  # whole records: the buffer flushes at record boundaries
            index.feed(view)
        chunks = compressor.feed([view])  # the view itself when not compressing
        for chunk in chunks:
            hasher.update(chunk)
        try:
            sink.write(chunks)
        except OSError as exc:  # not a reject of the file being read: the shard itself fails
            raise storage.write_error(fs_out, shard_path, exc) from None

    buffer = RecordBuffer(flush, task.image_feature)
    prefix = storage.join(root, "")  # + a listed (relative) path: no join per record
    local = storage.is_local(fs_in)
    records = len(task.listed) if task.listed is not None else len(task.entries)

    def reject(exc: OSError | InputError, rel: str) -> None:
        if task.on_error == "fail" or isinstance(
            exc, (TransformOutputError, errors.StaleListingError)
        ):
            raise _as_input_error(exc, task.source, rel) from exc
        rejected.append(Reject(rel, _reason(exc)))

    try:
        sink = storage.AtomicSink(fs_out, shard_path, temp_dir=layout.work_dir(out_dir))
    except OSError as exc:
        raise storage.write_error(fs_out, shard_path, exc) from None
    try:
        for batch, batch_tokens in _batches(task):
            first_reject = len(rejected)
            entries, tokens = batch, batch_tokens
            if any(size > MAX_FILE_BYTES for _, _, size in entries):
                for rel, _, size in entries:
                    if size > MAX_FILE_BYTES:
                        reject(_too_large(rel, size), rel)
                small = [k for k, (_, _, size) in enumerate(entries) if size <= MAX_FILE_BYTES]
                entries, tokens = tuple(entries[k] for k in small), tuple(tokens[k] for k in small)
            if fn is None and local and task.resize is None:  # the hot path: whole buffers
                expected = b"".join(expected_sha256(t) or bytes(32) for t in tokens)
                for i, problem in buffer.add_local_files(prefix, entries, expected):
                    rel, _, listed_size = entries[i]
                    reject(_file_problem(problem, rel, listed_size, prefix + rel), rel)
            else:
                for (rel, label, listed_size), token in zip(entries, tokens, strict=True):
                    try:
                        if fn is not None or task.resize is not None:
                            features = _features(
                                fs_in, root, rel, label, listed_size, token, task, fn, specs, keys
                            )
                            buffer.append(frame(encode(features)[0]))
                        else:
                            data = storage.read_bytes(fs_in, prefix + rel, size_hint=listed_size)
                            if len(data) == listed_size:  # else the size error says more
                                _check_md5(data, token, rel)
                            want = expected_sha256(token)
                            at = prefix + rel if local else None
                            _add(buffer, rel, label, listed_size, copy_into, data, want, at)
                    except (OSError, InputError) as exc:
                        reject(exc, rel)
            if len(entries) < len(batch):  # rejects in listing order, whatever found them first
                order = {rel: i for i, (rel, _, _) in enumerate(batch)}
                rejected[first_reject:] = sorted(
                    rejected[first_reject:], key=lambda r: order[r.path]
                )
        records -= len(rejected)
        buffer.flush()
        finished = compressor.finish()
        for chunk in finished:
            hasher.update(chunk)
        sink.write(finished)
        sink.commit()
    except OSError as exc:  # reading a file became a reject above: this is the sink's last write
        sink.abort()
        raise storage.write_error(fs_out, shard_path, exc) from None
    except BaseException:
        sink.abort()
        raise
    index_sha = None
    if index is not None:
        index_sha = _write_index(fs_out, out_dir, task.name, index.to_bytes())
    info = ShardInfo(task.name, records, sink.size, hasher.hexdigest(), index_sha)
    schema = tuple(specs[k] for k in sorted(specs))
    sidecar = layout.sidecar_path(out_dir, task.name)
    try:
        storage.write_atomic(fs_out, sidecar, [sidecar_json(info, rejected, schema)])
    except OSError as exc:
        raise storage.write_error(fs_out, sidecar, exc) from None
    return ShardResult(info, tuple(rejected), schema, reused=False)


def _too_large(rel: str, size: int) -> InputError:
    return InputError(
        f"file too large: expected at most {MAX_FILE_BYTES} bytes, found {size}", path=rel
    )


Entries = tuple[tuple[str, int, int], ...]


def _batches(task: ShardTask) -> Iterator[tuple[Entries, tuple[str, ...]]]:
    """``(entries, tokens)`` of the task, a bounded batch at a time when read from a listing."""
    if task.listed is None:
        yield task.entries, task.tokens or ("",) * len(task.entries)
        return
    for rows in task.listed.batches():
        yield tuple((r[0], r[2], r[1]) for r in rows), tuple(r[3] for r in rows)


def _add(
    buffer: RecordBuffer,
    rel: str,
    label: int,
    listed_size: int,
    read_into: ReadInto,
    source: Any,
    expected: bytes | None = None,
    local_path: str | None = None,
) -> None:
    """One file, no transform: straight into the buffer (the hot path)."""
    try:
        buffer.add_file(
            listed_size, label, rel.encode(), read_into, source, expected, claims_image(rel)
        )
    except (FileChanged, ContentChanged, NotAnImage) as exc:
        raise _file_problem(exc, rel, listed_size, local_path) from None


def _file_problem(
    problem: OSError | FileChanged | ContentChanged | NotAnImage,
    rel: str,
    listed_size: int,
    local_path: str | None = None,
) -> OSError | InputError:
    """What the framing reported about one file, as the error its reject or failure names."""
    if isinstance(problem, FileChanged):
        return _size_error(rel, listed_size, problem.found)
    if isinstance(problem, ContentChanged):
        return _content_error(rel, problem.expected, problem.found.hex(), local_path)
    if isinstance(problem, NotAnImage):
        return InputError(not_an_image(problem.head), path=rel)
    return problem


def _check_md5(data: bytes, token: str, rel: str) -> None:
    """Compare fetched bytes with an MD5 the storage listed (S3 single-part ETag, GCS md5)."""
    want = expected_md5(token)
    if want is not None:
        found = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if found != want:
            raise InputError(
                f"file changed since it was listed: expected md5 {want}, found {found}",
                path=rel,
            )


def _features(
    fs: Any,
    root: str,
    rel: str,
    label: int,
    listed_size: int,
    token: str,
    task: ShardTask,
    fn: transforms.Transform | None,
    specs: dict[str, FeatureSpec],
    keys: _Keys,
) -> dict[str, tuple[Dtype, Values]]:
    data = storage.read_bytes(fs, storage.join(root, rel), size_hint=listed_size)
    if len(data) != listed_size or not data:
        raise _size_error(rel, listed_size, len(data))
    _check_md5(data, token, rel)
    sha = hashlib.sha256(data)
    want = expected_sha256(token)
    if want is not None and sha.digest() != want:
        local_path = storage.join(root, rel) if storage.is_local(fs) else None
        raise _content_error(rel, want, sha.hexdigest(), local_path)
    if claims_image(rel) and image_format(data[:HEAD_BYTES]) is None:
        raise _file_problem(NotAnImage(data[:HEAD_BYTES]), rel, listed_size)
    payload = data
    if task.resize is not None:  # the record holds the resized image; sha256 stays its payload's
        try:
            payload = resize_image(data, task.resize)
        except InputError as exc:
            raise InputError(str(exc), path=rel) from None
        sha = hashlib.sha256(payload)
    features: dict[str, tuple[Dtype, Values]] = {
        task.image_feature: ("bytes", [payload]),
        "label": ("int64", [label]),
        "path": ("bytes", [rel.encode()]),
        "sha256": ("bytes", [sha.hexdigest().encode()]),
    }
    if fn is not None and task.transform is not None:
        out = transforms.apply(fn, task.transform, rel, data, label)
        added = {key: normalize(key, value) for key, value in out.items()}
        keys.check(rel, task.transform, added.keys())
        for key, (dtype, values, shape) in added.items():
            seen = FeatureSpec(key, dtype, shape)
            try:
                specs[key] = merge_specs(specs[key], seen) if key in specs else seen
            except TransformError as exc:
                raise TransformOutputError(f"{rel}: {exc}", path=rel) from exc
            features[key] = (dtype, values)
    return features


@dataclass
class _Keys:
    """The features a shard's first good file got from the transform, and that file."""

    first: str = ""
    keys: frozenset[str] | None = None

    def check(self, rel: str, spec: str, keys: Collection[str]) -> None:
        """Every file must get the features the first one got.

        A feature some records lack would make the schema a union that the
        records do not follow; the writer refuses it here, naming the file.
        """
        if self.keys is None:
            self.first, self.keys = rel, frozenset(keys)
        elif set(keys) != self.keys:
            raise TransformOutputError(
                f"{rel}: transform {spec}: " + keys_differ(sorted(self.keys), self.first, keys),
                path=rel,
            )


def keys_differ(expected: Sequence[str], first: str, found: Collection[str]) -> str:
    """``expected the features [...] that FIRST returned, found 'x' missing, 'y' extra``."""
    missing = [f"{k!r} missing" for k in sorted(set(expected) - set(found))]
    extra = [f"{k!r} extra" for k in sorted(set(found) - set(expected))]
    return (
        f"expected the features {list(expected)} that {first} returned, "
        f"found {', '.join(missing + extra)}"
    )


def _size_error(rel: str, listed: int, found: int) -> InputError:
    if found == 0:
        return InputError("empty file: expected at least 1 byte, found 0", path=rel)
    return InputError(
        f"file changed since it was listed: expected {listed} bytes, found {found}", path=rel
    )


def _content_error(rel: str, listed: bytes, found: str, local_path: str | None) -> InputError:
    """The file's bytes do not have the listed SHA-256: it changed, or the listing is wrong."""
    stale = stale_listing(rel, local_path, listed, found) if local_path is not None else None
    return stale or InputError(
        f"file changed since it was listed: expected sha256 {listed.hex()}, found {found}",
        path=rel,
    )


def _as_input_error(exc: Exception, source: str, rel: str) -> InputError:
    """Re-raise a per-file problem with the file's full location in front."""
    where = storage.join(source, rel)
    if isinstance(exc, InputError):
        return type(exc)(f"{where}: {_reason(exc)}", **{**_attrs(exc), "path": rel})
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


def _write_index(fs: Any, out_dir: str, name: str, data: bytes) -> str:
    """Publish a shard's record index file; its sha256."""
    path = layout.index_path(out_dir, name)
    try:
        storage.write_atomic(fs, path, [data])
    except OSError as exc:
        raise storage.write_error(fs, path, exc) from None
    return hashlib.sha256(data).hexdigest()


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
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(data) != info.bytes or hashlib.sha256(data).hexdigest() != info.sha256:
        return None
    if rejected:  # written with files left out: read them again (a reject may be transient,
        return None  # and under on_error "fail" one that persists must fail the write)
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
            _write_index(fs, out_dir, task.name, index)
    info = dataclasses.replace(info, index_sha256=index_sha)
    return ShardResult(info, rejected, schema, reused=True)
