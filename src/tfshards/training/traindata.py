"""What a run reads: the train and val datasets of a split, its steps per epoch, class weights.

Under ``strategy: multi_worker`` each of the N workers trains on its own block of
``train_records // N`` records of every epoch (the loader's ``input_context``),
disjoint from the others', in per-replica batches of ``batch_size / replicas``
(``batch_size`` stays the global batch); every worker takes the same
``(train_records // N) // (batch_size / N)`` steps per epoch. Validation is
read whole by every worker. With a mix (:mod:`tfshards.training.trainmix`) the
training batches are :func:`tfshards.reading.mixing.mix_datasets` of every set's
training side, one stream across epochs; an epoch is ``epoch_size // batch_size``
of its steps (one mixed epoch when the batch divides it); validation is ``--manifest``'s.

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
from tfshards.training.trainmix import Mix


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
        worker: ``(index, count)`` of this worker (``(0, 1)`` unless multi-worker).
        distributed: ``train`` is a distributed dataset (per-replica batches).
        mix: the sets mixed for training, or None for ``manifest``'s alone.
    """

    manifest: Manifest
    parts: Split
    train: Any
    val: Any
    channels: int
    batches: int
    class_weights: list[float] | None
    worker: tuple[int, int] = (0, 1)
    distributed: bool = False
    mix: Mix | None = None


def prepare(
    config: TrainConfig,
    manifest: Manifest,
    parts: Split,
    strategy: Any = None,
    mix: Mix | None = None,
) -> TrainData:
    """The train and val datasets, the steps per epoch and the class weights.

    ``strategy``: under ``multi_worker``, the ``MultiWorkerMirroredStrategy`` that
    distributes this worker's block of the training records.
    """
    from tfshards.reading import loader
    from tfshards.training.devices import worker_of

    distributed = config.strategy == "multi_worker"
    worker = worker_of(strategy) if distributed else (0, 1)
    if mix is not None:
        local = _mixed(config, mix)
    else:
        local = dataset(parts.train, manifest, config, training=True, worker=worker)
    train_ds = train_stream(config, manifest, parts, strategy) if distributed else local
    # The training images' channels for validation too: where the version's statistics do not
    # settle them, each set of shards would take its own first image's.
    channels = int(local.element_spec[0].shape[-1])
    val_ds = (
        dataset(parts.val, manifest, config, training=False, channels=channels)
        if parts.val
        else None
    )
    weights = None
    if config.class_weight == "balanced":
        counts = label_counts(parts.train, manifest) if mix is None else _mixed_counts(mix)
        weights = optim.balanced_class_weights(counts)
    step_records = config.batch_size // worker[1]  # this worker's share of a global batch
    if mix is not None:
        from tfshards.reading import mixing

        batches = mixing.steps_per_epoch(mix.sources(), config.batch_size)
    else:
        batches = loader.steps_per_epoch(parts.train, step_records, worker=worker)
    return TrainData(
        manifest,
        parts,
        train_ds,
        val_ds,
        channels=channels,
        batches=max(1, batches),
        class_weights=weights,
        worker=worker,
        distributed=distributed,
        mix=mix,
    )


def train_stream(
    config: TrainConfig,
    manifest: Manifest,
    parts: Split,
    strategy: Any = None,
    done: int = 0,
    mix: Mix | None = None,
) -> Any:
    """The training batches after ``done`` global steps (of ``mix`` when given); distributed
    by ``strategy`` (this worker's block, per-replica batches) under ``multi_worker``."""
    if mix is not None:
        return _mixed(config, mix, done)
    if config.strategy != "multi_worker":
        start = Position.after(done * config.batch_size, parts.train_records) if done else None
        return dataset(parts.train, manifest, config, training=True, start=start)

    def per_worker(context: Any) -> Any:
        count = context.num_input_pipelines
        start = Position.after(done * (config.batch_size // count), parts.train_records // count)
        return dataset(
            parts.train,
            manifest,
            config,
            training=True,
            start=start if done else None,
            batch_size=context.get_per_replica_batch_size(config.batch_size),
            input_context=context,
        )

    return strategy.distribute_datasets_from_function(per_worker)


def dataset(
    shards: Sequence[ShardInfo],
    manifest: Manifest,
    config: TrainConfig,
    *,
    training: bool,
    start: Position | None = None,
    batch_size: int | None = None,
    worker: tuple[int, int] | None = None,
    input_context: Any = None,
    channels: int | None = None,
) -> Any:
    """The batches of ``shards`` as ``config`` reads them; training from ``start`` on,
    this worker's block only (``worker`` or ``input_context``), in batches of
    ``batch_size`` (default ``config.batch_size``), at ``channels`` (default: the loader's
    choice)."""
    from tfshards.reading import loader

    return loader.make_dataset(
        shards,
        manifest,
        batch_size=batch_size or config.batch_size,
        training=training,
        seed=config.seed,
        image_size=(config.image_size, config.image_size),
        channels=channels,
        image_dtype=config.image_dtype,
        scaled_decode=config.scaled_decode,
        deterministic=config.deterministic,
        start=start,
        worker=worker,
        input_context=input_context,
    )


def _mixed(config: TrainConfig, mix: Mix, done: int = 0) -> Any:
    """The mix's training batches after ``done`` steps (a mixed epoch's position)."""
    from tfshards.reading import mixing

    sources = mix.sources()
    size = mixing.plan_of(sources, seed=config.seed).epoch_size
    return mixing.mix_datasets(
        sources,
        batch_size=config.batch_size,
        seed=config.seed,
        start=Position.after(done * config.batch_size, size) if done else None,
        image_size=(config.image_size, config.image_size),
        image_dtype=config.image_dtype,
        scaled_decode=config.scaled_decode,
        deterministic=config.deterministic,
    )


def _mixed_counts(mix: Mix) -> list[int]:
    """Each label's expected records in one mixed epoch: every set's counts at its share."""
    from tfshards.reading import mixing

    plan = mixing.plan_of(mix.sources())
    total = [0.0] * len(mix.manifests[0].labels)
    for i, (parts, manifest) in enumerate(zip(mix.parts, mix.manifests, strict=True)):
        share = int(plan.counts[i]) / max(1, parts.train_records)
        for label, count in enumerate(label_counts(parts.train, manifest)):
            total[label] += count * share
    return [round(t) for t in total]


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
