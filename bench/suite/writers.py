"""Ways to turn a listing into TFRecord shards: tfshards and what a user would write instead.

TensorFlow is imported inside the functions: the write workers of tfshards
start from a forkserver that would otherwise import it (3-5 s) for nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing
import os
import random
from typing import Any

from bench.suite.rounds import Work
from tfshards.listing.listing import Listing
from tfshards.shardset.layout import shard_name
from tfshards.writing.config import WriteConfig
from tfshards.writing.sharding import shard_boundaries
from tfshards.writing.writer import write

NUM_SHARDS = 16  # what tfshards picks for both data sets (docs/decisions.md)


def tfshards_write(
    listing: Listing, out: str, workers: int = 2, executor: str = "auto", **options: Any
) -> Work:
    """tfshards; ``out`` must be fresh (a finished version is reused).

    ``workers`` > 1 runs ``executor`` (``auto``: threads when tfshards.format._native is
    built, ``process``: a pool started for this call); 1 runs in this process.
    ``options``: more WriteConfig keywords (``exif="warn"``).
    """
    executor = executor if workers > 1 else "serial"
    config = WriteConfig(out=out, workers=workers, executor=executor, **options)
    result = write(config, listing, progress=False)
    return result.manifest.records, listing.total_bytes


Item = tuple[str, str, int]  # (absolute path, path relative to the root, label)


def _plan(listing: Listing) -> list[list[Item]]:
    """Shuffle once, cut into ``NUM_SHARDS`` contiguous runs."""
    entries = [(os.path.join(listing.root, e.path), e.path, e.label) for e in listing.entries]
    random.Random(0).shuffle(entries)
    bounds = shard_boundaries(len(entries), min(NUM_SHARDS, len(entries)))
    return [entries[a:b] for a, b in itertools.pairwise(bounds)]


def write_one_shard(path: str, entries: list[Item]) -> None:
    """The loop a user writes: read, hash, build a ``tf.train.Example``, write."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(path) as writer:
        for file_path, rel, label in entries:
            with open(file_path, "rb") as f:
                data = f.read()
            digest = hashlib.sha256(data).hexdigest().encode()
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                        "path": tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[rel.encode()])
                        ),
                        "sha256": tf.train.Feature(bytes_list=tf.train.BytesList(value=[digest])),
                    }
                )
            )
            writer.write(example.SerializeToString())


def naive_write(listing: Listing, out: str) -> Work:
    """One process, one shard after another."""
    shards = _plan(listing)
    for i, entries in enumerate(shards):
        write_one_shard(os.path.join(out, shard_name("data", i, len(shards))), entries)
    return len(listing.entries), listing.total_bytes


def seed_recipe_write(listing: Listing, out: str) -> Work:
    """One ``multiprocessing.Process`` per shard, each joined right after its start.

    The recipe this project started from: it looks parallel but runs the shards
    one after another, paying a process start each (default start method: fork).
    """
    shards = _plan(listing)
    for i, entries in enumerate(shards):
        path = os.path.join(out, shard_name("data", i, len(shards)))
        proc = multiprocessing.Process(target=write_one_shard, args=(path, entries))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"{path}: writer process exited with {proc.exitcode}")
    return len(listing.entries), listing.total_bytes


def tfds_write(listing: Listing, out: str) -> Work:
    """tensorflow-datasets' ``download_and_prepare`` of a local builder (no download)."""
    from bench.suite.tfds_builder import build

    build(listing, out, NUM_SHARDS)
    return len(listing.entries), listing.total_bytes
