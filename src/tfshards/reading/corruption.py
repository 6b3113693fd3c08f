"""Name the shard, record and byte offset behind TensorFlow's nameless record errors."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from tfshards import storage
from tfshards.errors import ConfigError, RecordError, ShardError
from tfshards.reading.cache import ShardCache
from tfshards.reading.chunks import raised_in
from tfshards.shardset.manifest import Manifest, ShardInfo

# Messages that mean "the bytes of a record are bad" (not a model or user error): TensorFlow's
# own, and tfshards.reading.gate's when a shard changed under a running loader.
_RECORD_PROBLEM = re.compile(
    r"corrupt|truncat|checksum|crc|could not parse|parse example|data loss"
    r"|is required but could not be found|negative number of bytes|utf-8|codec"
    r"|image file format|decode|invalid (?:jpeg|png|gif|bmp|webp) data"
    r"|sha256 mismatch|size mismatch|record count mismatch",
    re.IGNORECASE,
)
# Scan with Pillow too. A scaled decode reads a JPEG's shape first: "Invalid JPEG data".
_IMAGE_PROBLEM = re.compile(
    r"image file format|decode|invalid (?:jpeg|png|gif|bmp|webp) data", re.IGNORECASE
)
# An image decoded to another shape than the dataset's (no image_size given): not a bad record.
_OTHER_SHAPE = re.compile(r"\[([\d,]+)\] is not compatible with expected shape \[([\d,]+)\]")


@contextlib.contextmanager
def shard_errors(
    manifest: Manifest,
    shards: Sequence[ShardInfo] | None = None,
    *,
    cache_dir: str | None = None,
    **storage_options: Any,
) -> Iterator[None]:
    """Re-raise nameless errors about bad records as :class:`RecordError` naming the shard.

    Wrap :func:`tfshards.reading.loader.make_dataset` and ``model.fit(...)`` (or an
    iteration over the dataset). A ``DataLossError``, or a TensorFlow or
    Python error about a record's content (a parse error, a required feature
    missing, an image that does not decode, bytes that are not UTF-8) raised
    inside starts a scan of the local copies of ``shards`` (default: all),
    with every image decoded when the error was about one; the first bad
    record found is raised, chained to the original error, which is re-raised
    when the scan finds nothing. An error the chunk reader raised about a
    record (:mod:`tfshards.reading.chunks`: a shard changed after it was
    verified) is re-raised as it is, without a scan; one about the whole
    shard (its sha256 when opened again) is re-raised when the scan finds no
    record at fault. An image of another shape than the dataset's (a set of
    several sizes read without ``image_size``) is a :class:`ConfigError`
    saying both shapes. Costs nothing while all is well.
    """
    import tensorflow as tf

    try:
        yield
    except (tf.errors.OpError, ValueError) as exc:
        message = str(exc)
        other = _OTHER_SHAPE.search(message)
        if other:
            decoded, expected = (tuple(int(d) for d in g.split(",")) for g in other.groups())
            raise ConfigError(
                f"{manifest.directory}: an image decoded to {decoded} (height, width, channels) "
                f"where the dataset's shape is {expected}, from its first image: pass "
                "image_size (and channels) to resize every image to one shape"
            ) from exc
        checked = raised_in(message)  # the chunk reader's or the gate's own error
        if isinstance(checked, RecordError):  # already names the record
            raise checked from exc
        if checked is None and not (
            isinstance(exc, (tf.errors.DataLossError, UnicodeDecodeError))
            or _RECORD_PROBLEM.search(message)
        ):
            raise
        found = find_corrupt_record(
            manifest,
            shards,
            cache_dir=cache_dir,
            decode_images=bool(_IMAGE_PROBLEM.search(message)),
            said=message,
            **storage_options,
        )
        if found is not None:  # a sha256 mismatch: the scan says which record
            raise found from exc
        if checked is not None:
            raise checked from exc
        raise


def find_corrupt_record(
    manifest: Manifest,
    shards: Sequence[ShardInfo] | None = None,
    *,
    cache_dir: str | None = None,
    decode_images: bool = False,
    said: str = "",
    **storage_options: Any,
) -> ShardError | None:
    """Check the local copies of ``shards`` (default: all) and describe the first bad one.

    Runs :func:`tfshards.validation.shardcheck.validate_shard` (size, sha256, framing, both
    CRCs, each record against the schema) on each shard in turn. Remote
    shards are checked only where cached. Returns a :class:`RecordError`
    when a record is at fault (a :class:`ShardError` for the file as a whole),
    not raised; None when all is well. With ``said`` (TensorFlow's error), an
    image whose decoder error TensorFlow's message holds is the one at fault
    (``Invalid PNG data, size 5868``): the scan goes on past the first bad
    record to find it, and falls back to the first.
    """
    from tfshards.validation.shardcheck import ShardCheck, validate_shard

    fs, root = storage.open_url(manifest.directory, **storage_options)
    cache = None if storage.is_local(fs) else ShardCache(cache_dir)
    first: ShardError | None = None
    matching = decode_images and bool(said)
    for shard in manifest.shards if shards is None else shards:
        path = storage.join(root, shard.name) if cache is None else cache.path(shard)
        if cache is not None and not os.path.exists(path):
            continue
        check = ShardCheck.of(
            manifest, shard, path=path, decode_images=decode_images, max_problems=8
        )
        report = validate_shard(check)
        if not report.problems:
            continue
        where = manifest.shard_url(shard)
        records = [p for p in report.problems if p.index is not None]
        hit = next((p for p in records if _named_in(p.what, said)), None) if matching else None
        if hit is not None:  # that record's first problem: what the rules say of it first
            said_first = next(p for p in records if p.index == hit.index)
            return _record_error(where, shard.name, said_first, path)
        if records and not matching:
            return _record_error(where, shard.name, records[0], path)
        whole = ShardError(f"{where}: {report.problems[0].what}", shard=shard.name, path=path)
        if not matching:
            return whole
        first = first or (_record_error(where, shard.name, records[0], path) if records else whole)
    return first


def _record_error(where: str, shard: str, problem: Any, path: str) -> RecordError:
    return RecordError(
        f"{where}: record {problem.index} at byte {problem.offset}: {problem.what}",
        shard=shard,
        index=problem.index,
        offset=problem.offset,
        path=path,
    )


_UNDECODED = "does not decode as an image: "  # tfshards.validation.rules.payload_decodes


def _named_in(problem: str, said: str) -> bool:
    """Whether TensorFlow's error ``said`` holds the decoder's words of ``problem``."""
    _, found, words = problem.partition(_UNDECODED)
    return bool(found and words and words in said)


def first_image_error(
    manifest: Manifest,
    shards: Sequence[ShardInfo],
    exc: Exception,
    *,
    cache_dir: str | None = None,
    **storage_options: Any,
) -> ShardError:
    """The record whose image could not be read for a dataset's shape, named: the first
    record of the first shard with records (decoded to find it); ``exc``: TensorFlow's
    error, said when the scan finds nothing."""
    first = [s for s in shards if s.records][:1]
    found = find_corrupt_record(
        manifest, first, cache_dir=cache_dir, decode_images=True, **storage_options
    )
    if found is not None:
        return found
    line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = manifest.shard_url(first[0]) if first else manifest.directory
    return ShardError(f"{where}: record 0: its image does not decode: {line}", path=where)
