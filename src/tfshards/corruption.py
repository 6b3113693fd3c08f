"""Name the shard, record and byte offset behind TensorFlow's nameless record errors."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from tfshards import storage
from tfshards.cache import ShardCache
from tfshards.errors import RecordError, ShardError
from tfshards.manifest import Manifest, ShardInfo

# TensorFlow messages that mean "the bytes of a record are bad" (not a model or user error).
_RECORD_PROBLEM = re.compile(
    r"corrupt|truncat|checksum|crc|could not parse|parse example|data loss", re.IGNORECASE
)


@contextlib.contextmanager
def shard_errors(
    manifest: Manifest,
    shards: Sequence[ShardInfo] | None = None,
    *,
    cache_dir: str | None = None,
    **storage_options: Any,
) -> Iterator[None]:
    """Re-raise TensorFlow's nameless record errors as :class:`RecordError` naming the shard.

    Wrap ``model.fit(...)`` or an iteration over :func:`tfshards.loader.make_dataset`. A
    ``DataLossError`` (or a parse error) raised inside starts a scan of the
    local copies of ``shards`` (default: all); the first bad record found is
    raised, chained to TensorFlow's error. Costs nothing while all is well.
    """
    import tensorflow as tf

    try:
        yield
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
        if isinstance(exc, tf.errors.InvalidArgumentError) and not _RECORD_PROBLEM.search(str(exc)):
            raise
        found = find_corrupt_record(manifest, shards, cache_dir=cache_dir, **storage_options)
        if found is None:
            raise
        raise found from exc


def find_corrupt_record(
    manifest: Manifest,
    shards: Sequence[ShardInfo] | None = None,
    *,
    cache_dir: str | None = None,
    **storage_options: Any,
) -> ShardError | None:
    """Check the local copies of ``shards`` (default: all) and describe the first bad one.

    Runs :func:`tfshards.validate.validate_shard` (size, sha256, framing, both
    CRCs, each record against the schema) on each shard in turn. Remote
    shards are checked only where cached. Returns a :class:`RecordError`
    when a record is at fault (a :class:`ShardError` for the file as a whole),
    not raised; None when all is well.
    """
    from tfshards.validate import ShardCheck, validate_shard

    fs, root = storage.open_url(manifest.root, **storage_options)
    cache = None if storage.is_local(fs) else ShardCache(cache_dir)
    for shard in manifest.shards if shards is None else shards:
        path = storage.join(root, shard.name) if cache is None else cache.path(shard)
        if cache is not None and not os.path.exists(path):
            continue
        report = validate_shard(ShardCheck.of(manifest, shard, path=path, max_problems=8))
        if not report.problems:
            continue
        where = manifest.shard_url(shard)
        for problem in report.problems:
            if problem.index is not None:
                return RecordError(
                    f"{where}: record {problem.index} at byte {problem.offset}: {problem.what}",
                    shard=shard.name,
                    index=problem.index,
                    offset=problem.offset,
                    path=path,
                )
        return ShardError(f"{where}: {report.problems[0].what}", shard=shard.name, path=path)
    return None
