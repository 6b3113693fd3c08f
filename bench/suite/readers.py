"""Ways to read one epoch of decoded (image, label) batches from shards.

All three decode every JPEG to float32 in [0, 1] and batch ``BATCH`` records.
Each function builds the dataset; :class:`bench.suite.rounds.Epochs` builds it once
(in the warm-up) and times the epochs after. tfshards and the seed reader read
the same shard files; tfds reads its own build of the same images.
"""

from __future__ import annotations

import os
from typing import Any

from tfshards.listing.listing import Listing
from tfshards.reading.loader import make_dataset
from tfshards.shardset.manifest import Manifest

BATCH = 128
SEED_SHUFFLE = 1000  # the seed reader's shuffle buffer (records)


def tfshards_read(manifest: Manifest) -> Any:
    """``tfshards.reading.loader.make_dataset`` with ``training=False`` (no shuffle, no repeat)."""
    return make_dataset(manifest.shards, manifest, batch_size=BATCH, training=False)


def _usual_records(manifest: Manifest, side: int | None) -> tuple[Any, Any]:
    """The usual reader's parallel interleave over the shards, and its per-record parse.

    The parse is ``parse_single_example`` + ``decode_jpeg`` (+ ``resize`` to
    ``side``), to float32 in [0, 1].
    """
    import tensorflow as tf

    paths = [os.path.join(manifest.root, s.name) for s in manifest.shards]
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, spec)
        image = tf.io.decode_jpeg(example["image"], channels=3)
        if side is not None:
            return tf.image.resize(image, (side, side)) / 255.0, example["label"]
        return tf.cast(image, tf.float32) / 255.0, example["label"]

    files = tf.data.Dataset.from_tensor_slices(paths)
    records = files.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)
    return records, parse


def seed_read(manifest: Manifest) -> Any:
    """The seed's reader: interleave -> shuffle -> parse_single_example + decode_jpeg -> batch."""
    import tensorflow as tf

    records, parse = _usual_records(manifest, None)
    return (
        records.shuffle(SEED_SHUFFLE).map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
    )


def tfds_read(listing: Listing, data_dir: str) -> Any:
    """tensorflow-datasets' ``as_dataset`` of the prepared build (it decodes the images).

    Auto-caching is off: by default tfds keeps the *decoded* examples of a set
    under 250 MiB on disk in memory after the first epoch (1.5 GB for the
    large set here), and later epochs would then decode nothing.
    """
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from bench.suite.tfds_builder import BenchImages

    builder = BenchImages(listing=listing, data_dir=data_dir, file_format="tfrecord")
    dataset = builder.as_dataset(
        split="train", as_supervised=True, read_config=tfds.ReadConfig(try_autocache=False)
    )
    dataset = dataset.map(
        lambda image, label: (tf.cast(image, tf.float32) / 255.0, label),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return dataset.batch(BATCH).prefetch(tf.data.AUTOTUNE)


RESIZED = (224, 112)  # target sides for reading the large set resized (ImageNet-like, and half)


def seed_read_resized(manifest: Manifest, side: int) -> Any:
    """The usual resizing reader: interleave -> parse_single_example + decode_jpeg + resize."""
    import tensorflow as tf

    records, parse = _usual_records(manifest, side)
    return (
        records.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )


def tfshards_read_resized(
    manifest: Manifest, side: int, scaled: bool = True, per_record: bool | None = None
) -> Any:
    """``make_dataset`` resizing to ``side`` (scaled JPEG decode unless ``scaled`` is False).

    ``per_record``: as :func:`make_dataset` takes it (None: the loader's plan picks).
    """
    return make_dataset(
        manifest.shards,
        manifest,
        batch_size=BATCH,
        training=False,
        image_size=(side, side),
        channels=3,
        scaled_decode=scaled,
        per_record=per_record,
    )


# Source side -> target side of the read-by-size rows: a model's input size; the 512 px
# JPEGs read at ImageNet's 224. Each set is read by the usual resizing reader and by tfshards.
SIZES = {32: 32, 64: 64, 96: 96, 224: 224, 512: 224}
