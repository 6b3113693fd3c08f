"""What a run reads: batches decoded as the config says, class counts, steps per epoch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.shardset.manifest import Manifest
from tfshards.shardset.split import split
from tfshards.training.optim import balanced_class_weights
from tfshards.training.trainconfig import TrainConfig
from tfshards.training.traindata import dataset, label_counts, prepare
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write


@pytest.mark.parametrize("scaled", [True, False])
def test_scaled_decode_param_decides_how_the_loader_decodes(
    make_raw: Callable[..., Path],
    write_set: Callable[..., Manifest],
    tmp_path: Path,
    scaled: bool,
) -> None:
    import numpy as np

    from tfshards.reading import loader

    raw = make_raw(8, 64)  # 64 px JPEGs read at 16: ratio 4
    m = write_set(raw, tmp_path / "shards", num_shards=2, executor="serial")
    train_config = TrainConfig(image_size=16, batch_size=8, scaled_decode=scaled)
    got = next(iter(dataset(m.shards, m, train_config, training=False)))[0].numpy()

    def read(scaled_decode: bool) -> Any:
        data = loader.make_dataset(
            m.shards,
            m,
            batch_size=8,
            training=False,
            image_size=(16, 16),
            scaled_decode=scaled_decode,
        )
        return next(iter(data))[0].numpy()

    np.testing.assert_array_equal(got, read(scaled))
    assert not np.array_equal(got, read(not scaled))


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """24 JPEGs of 3 classes at 16 px in 4 shards; returns the manifest."""
    tmp = tmp_path_factory.mktemp("shards")
    write_synthetic(str(tmp / "raw"), 24, 16, classes=3, workers=1)
    config = WriteConfig(out=str(tmp / "shards"), num_shards=4, executor="serial")
    return write(config, list_files(str(tmp / "raw")), progress=False).manifest


def test_label_counts_count_every_record_once_per_class(shards: Any) -> None:
    import numpy as np

    from tfshards.reading import loader

    counts = label_counts(shards.shards, shards)
    every = loader.make_dataset(shards.shards, shards, batch_size=100, training=False)
    labels = np.concatenate([y.numpy() for _, y in every])
    assert counts == np.bincount(labels, minlength=len(shards.labels)).tolist()
    assert sum(counts) == shards.records == 24


def test_prepare_makes_both_sides_the_steps_per_epoch_and_balanced_weights(shards: Any) -> None:
    parts = split(shards, 0.25, 0)
    config = TrainConfig(image_size=8, batch_size=4, class_weight="balanced")
    data = prepare(config, shards, parts)
    assert data.batches == parts.train_records // 4
    assert data.channels == 3
    x, y = next(iter(data.train))
    assert tuple(x.shape) == (4, 8, 8, 3) and tuple(y.shape) == (4,)
    assert data.val is not None
    assert sum(int(y.shape[0]) for _, y in data.val) == parts.val_records
    assert len(data.val) == -(-parts.val_records // 4) == sum(1 for _ in data.val)
    assert int(data.train.cardinality()) == -1  # endless: ``batches`` steps an epoch
    counts = label_counts(parts.train, shards)
    assert data.class_weights == balanced_class_weights(counts)


def test_without_val_shards_there_is_no_val_dataset_nor_weights(shards: Any) -> None:
    data = prepare(TrainConfig(image_size=8, batch_size=64), shards, split(shards, 0.0, 0))
    assert data.val is None and data.class_weights is None
    assert data.batches == 1  # fewer records than a batch: one step still


def test_validation_reads_at_the_training_images_channels(tmp_path: Path) -> None:
    """Without image statistics each set of shards would take its own first image's
    channels: a gray training side and a colour validation side must still meet the model
    at one count (the training side's)."""
    import dataclasses
    import os

    from PIL import Image

    raw = tmp_path / "raw"
    for label, mode, colour in (("gray", "L", 90), ("rgb", "RGB", (200, 10, 10))):
        (raw / label).mkdir(parents=True)
        for i in range(6):
            Image.new(mode, (16, 16), colour).save(raw / label / f"{i}.png")
    config = WriteConfig(
        out=str(tmp_path / "shards"), num_shards=2, executor="serial", group_by=r"^(\w+)/"
    )
    manifest = write(config, list_files(str(raw)), progress=False).manifest
    os.remove(Path(manifest.directory) / "imagestats.json")  # a version written without them
    shards = sorted(manifest.shards, key=lambda s: s.name)
    parts = split(manifest, 0.0, 0)
    by_label = {}
    for shard in shards:
        y = next(iter(dataset([shard], manifest, TrainConfig(image_size=8), training=False)))[1]
        by_label[manifest.labels[int(y.numpy()[0])]] = shard
    assert set(by_label) == {"gray", "rgb"}  # one label a shard
    parts = dataclasses.replace(parts, train=(by_label["gray"],), val=(by_label["rgb"],))
    data = prepare(TrainConfig(image_size=8, batch_size=4), manifest, parts)
    assert data.channels == 1
    assert next(iter(data.val))[0].shape[-1] == 1
