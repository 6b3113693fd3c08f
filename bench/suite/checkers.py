"""Ways to check a shard set: tfshards validate and the eager TensorFlow loop a user writes."""

from __future__ import annotations

import os

from bench.suite.rounds import Work
from tfshards import cachedir
from tfshards.shardset.manifest import Manifest
from tfshards.validation.validate import ValidateConfig, validate


def tfshards_validate(
    manifest_url: str, workers: int = 2, executor: str = "process", cache: str | None = None
) -> Work:
    """Every check: file sha256, framing and both CRCs, each record against the schema.

    ``workers`` > 1 starts a pool of ``executor`` for this call; 1 runs in this process.
    ``cache``: also the near-duplicate check, its image hashes kept in this cache folder.
    """
    executor = executor if workers > 1 else "serial"
    config = ValidateConfig(
        manifest=manifest_url, workers=workers, executor=executor, near_duplicates=bool(cache)
    )
    saved = os.environ.get(cachedir.ENV)
    if cache:  # read where the pool starts: its workers inherit it
        os.environ[cachedir.ENV] = cache
    try:
        report = validate(config)
    finally:
        if saved is None:
            os.environ.pop(cachedir.ENV, None)
        else:
            os.environ[cachedir.ENV] = saved
    if not report.ok:
        raise RuntimeError(f"bench shards did not validate: {report.summary()}")
    return report.records, report.bytes


def eager_validate(manifest: Manifest) -> Work:
    """Read every record with ``TFRecordDataset`` (CRCs) and parse it as an Example."""
    import tensorflow as tf

    paths = [os.path.join(manifest.root, s.name) for s in manifest.shards]
    records = 0
    for raw in tf.data.TFRecordDataset(paths):
        tf.train.Example.FromString(raw.numpy())
        records += 1
    return records, sum(os.path.getsize(p) for p in paths)
