"""What a run reads: the train and val datasets of a split, its steps per epoch, class weights.

TensorFlow and the loader are imported when the datasets are made, not with this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfshards.reading.epochorder import Position
from tfshards.shardset.manifest import Manifest, ShardInfo
from tfshards.shardset.split import Split
from tfshards.training import optim
from tfshards.training.trainconfig import TrainConfig


@dataclass(frozen=True)
class TrainData:
    """The manifest, its split and the datasets made from it.

    Attributes:
        train: the training batches from the first epoch's start, endless (one
            iterator serves every epoch; :func:`dataset` starts one anywhere).
        val: the validation batches, or None without validation shards.
        channels: image channels of a batch.
        batches: training steps per epoch.
        class_weights: per-class loss weights, or None for 1 each.
    """

    manifest: Manifest
    parts: Split
    train: Any
    val: Any
    channels: int
    batches: int
    class_weights: list[float] | None


def prepare(config: TrainConfig, manifest: Manifest, parts: Split) -> TrainData:
    """The train and val datasets, the steps per epoch and the class weights."""
    train_ds = dataset(parts.train, manifest, config, training=True)
    val_ds = dataset(parts.val, manifest, config, training=False) if parts.val else None
    weights = None
    if config.class_weight == "balanced":
        weights = optim.balanced_class_weights(label_counts(parts.train, manifest))
    return TrainData(
        manifest,
        parts,
        train_ds,
        val_ds,
        channels=int(train_ds.element_spec[0].shape[-1]),
        batches=max(1, parts.train_records // config.batch_size),
        class_weights=weights,
    )


def dataset(
    shards: Sequence[ShardInfo],
    manifest: Manifest,
    config: TrainConfig,
    *,
    training: bool,
    start: Position | None = None,
) -> Any:
    """The batches of ``shards`` as ``config`` reads them; training from ``start`` on."""
    from tfshards.reading import loader

    return loader.make_dataset(
        shards,
        manifest,
        batch_size=config.batch_size,
        training=training,
        seed=config.seed,
        image_size=(config.image_size, config.image_size),
        image_dtype=config.image_dtype,
        scaled_decode=config.scaled_decode,
        deterministic=config.deterministic,
        start=start,
    )


def label_counts(shards: Sequence[ShardInfo], manifest: Manifest) -> list[int]:
    """Records per class in ``shards`` (one pass reading only the labels)."""
    import numpy as np

    from tfshards.reading import loader

    counts = np.zeros(len(manifest.labels), np.int64)
    labels_only = loader.make_dataset(
        shards, manifest, batch_size=4096, training=False, decode=False, features=[]
    )
    for _, y in labels_only:
        counts += np.bincount(y.numpy(), minlength=len(counts))[: len(counts)]
    return [int(c) for c in counts]
