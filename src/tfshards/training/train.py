"""Train a classifier on a manifest's shards, timing how long each step waits for data.

The loop is written out (not ``model.fit``) so the wait for data can be timed
where it happens: Keras pulls batches inside its compiled train function, out
of reach of Python. Per step, the time blocked in ``next(iterator)`` is the
input stall; the epoch's wall time is the whole. Their ratio is the
``input_bound_fraction`` (see :mod:`tfshards.training.stall`). TensorFlow is imported on
first use, so :class:`TrainConfig` loads in milliseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import jsonfile, storage
from tfshards.errors import ConfigError
from tfshards.shardset import manifest as manifests
from tfshards.shardset.split import split
from tfshards.training import confusion, models, optim
from tfshards.training.checkpoint import Checkpoint, settings_key
from tfshards.training.devices import device_name, make_strategy, tf_state
from tfshards.training.export import export_serving, save_model
from tfshards.training.history import (
    MODEL_METRICS,
    EpochResult,
    early_stop_note,
    stop_early,
    summarize,
)
from tfshards.training.stall import (
    timed_loop,
)
from tfshards.training.steps import TrainSteps
from tfshards.training.trainconfig import TrainConfig

__all__ = [
    "TrainResult",
    "train",
    "write_json",
]


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` did: the summary metrics, every epoch, and the split."""

    metrics: dict[str, Any]
    epochs: tuple[EpochResult, ...]
    split: Any  # tfshards.shardset.split.Split

    def summary(self) -> str:
        m = self.metrics
        val = f"val_accuracy {m['val_accuracy']:.4f}, " if "val_accuracy" in m else ""
        return (
            f"trained {m['model']} for {m['epochs']} epochs on {m['train_records']} records: "
            f"{val}accuracy {m['accuracy']:.4f}, {m['examples_per_s']:.0f} examples/s, "
            f"input-bound {m['input_bound_fraction']:.0%}, on {m['device']} in {m['seconds']:.1f}s"
        )


def train(config: TrainConfig, *, log: Callable[[str], None] | None = None) -> TrainResult:
    """Train ``config.model`` on the manifest's shards and write every output.

    Splits the shards (whole files) into train and validation, trains on
    (weighted, smoothed) cross-entropy, evaluates after every epoch, logs
    per-epoch metrics to dvclive and checkpoints, resuming after the last
    finished epoch of a killed run with the same settings. Then writes the
    validation confusion matrix, the summary metrics, the split, the model and
    its serving export, and removes the checkpoint. Global TensorFlow state it
    changes (dtype policy, op determinism) is restored on return.

    Args:
        config: what to train.
        log: called with one line per epoch (None: silent).
    """
    started = time.perf_counter()
    if models.is_user_model(config.model):
        models.load_builder(config.model)  # a bad module fails before any data is read
    # Then the manifest: a wrong path is said before TensorFlow's 3-5 s import.
    manifest = manifests.load(config.manifest)
    labels = manifest.labels
    if len(labels) < 2:
        raise ConfigError(
            f"{config.manifest}: a classifier needs at least 2 labels, found {len(labels)}"
        )
    import tensorflow as tf

    from tfshards.reading import loader
    from tfshards.reading.corruption import shard_errors

    split_seed = config.seed if config.split_seed is None else config.split_seed
    parts = split(manifest, config.val_fraction, split_seed)
    device = device_name()
    mixed = config.mixed_precision == "on" or (config.mixed_precision == "auto" and device != "CPU")
    strategy = make_strategy(config.strategy)
    if config.strategy == "mirrored" and strategy.num_replicas_in_sync == 1 and log is not None:
        log(f"strategy mirrored: one device found ({device}), so one replica trains")
    # Seeds first: tf.data ops take the global seed into theirs when they are made.
    with tf_state(config.seed, deterministic=config.deterministic, mixed=mixed):
        train_ds = _dataset(loader, parts.train, manifest, config, training=True)
        val_ds = (
            _dataset(loader, parts.val, manifest, config, training=False) if parts.val else None
        )
        channels = int(train_ds.element_spec[0].shape[-1])
        batches = max(1, parts.train_records // config.batch_size)
        weights = None
        if config.class_weight == "balanced":
            weights = optim.balanced_class_weights(_label_counts(loader, parts, manifest))
        with strategy.scope():
            model = models.with_input(
                models.build_model(
                    config.model,
                    image_size=config.image_size,
                    channels=channels,
                    classes=len(labels),
                    model_args=config.model_args,
                ),
                image_dtype=config.image_dtype,
                augment=config.augment,
                seed=config.seed,
            )
            rate = optim.learning_rate(
                config.learning_rate,
                config.lr_schedule,
                total_steps=batches * config.epochs,
                warmup_steps=batches * config.warmup_epochs,
            )
            optimizer = optim.make_optimizer(
                config.optimizer, rate, momentum=config.momentum, weight_decay=config.weight_decay
            )
        steps = TrainSteps(
            model,
            optimizer,
            strategy=strategy,
            classes=len(labels),
            global_batch=config.batch_size,
            label_smoothing=config.label_smoothing,
            class_weights=weights,
            mixed=mixed,
            jit_compile=config.jit_compile,
        )
        # Training: endless, one iterator for all epochs (the pipeline never restarts).
        iterator = iter(train_ds)
        checkpoint = None
        results: list[EpochResult] = []
        if config.checkpoint_dir:
            checkpoint = Checkpoint(
                config.checkpoint_dir,
                settings_key({**config.settings(), "fingerprint": manifest.fingerprint}),
                {
                    "model": [v.value for v in model.variables],
                    "optimizer": [v.value for v in steps.optimizer.variables],
                    "iterator": iterator,
                },
            )
            done, history = checkpoint.restore(log)
            results = [EpochResult.from_json(doc) for doc in history]
            if done and log is not None:
                log(f"resuming after epoch {done}/{config.epochs} from {config.checkpoint_dir}")
        live = _open_live(config.live_dir, resume=bool(results))
        if live is not None and results:
            live.step = len(results)  # epochs logged after the checkpoint are logged again
        elif config.live_dir is not None:  # the folder persists (for resuming): no stale matrix
            fs, path = storage.open_url(_confusion_url(config.live_dir))
            if fs.exists(path):
                fs.rm(path)
        predictions: tuple[list[int], list[int]] | None = None
        matrix: list[list[int]] = []
        try:
            with shard_errors(manifest, parts.train + parts.val):
                for epoch in range(len(results) + 1, config.epochs + 1):
                    if stop_early(results, config.early_stopping, config.early_stopping_metric):
                        if log is not None:
                            rate = float(steps.optimizer.learning_rate)
                            note = early_stop_note(
                                results,
                                config.early_stopping,
                                config.early_stopping_metric,
                                config.epochs,
                            )
                            log(f"{note}; learning rate at the stop {rate:.3g}")
                        break
                    timing = timed_loop(
                        iterator,
                        batches,
                        lambda b: steps.train(b[0], b[1]),
                        count=lambda b: int(b[1].shape[0]),
                        sync=lambda loss: loss.numpy(),
                    )
                    loss, accuracy = steps.train_metrics()
                    val_loss = val_accuracy = None
                    if val_ds is not None:
                        val_loss, val_accuracy, *evaluated = steps.evaluate(val_ds)
                        predictions = (evaluated[0], evaluated[1])
                    result = EpochResult(epoch, loss, accuracy, val_loss, val_accuracy, timing)
                    results.append(result)
                    _log_epoch(live, None, result, config.epochs)
                    if checkpoint is not None:
                        checkpoint.save(epoch, [r.to_json() for r in results])
                    _log_epoch(None, log, result, config.epochs)
                if val_ds is not None and predictions is None:  # all epochs were done before
                    predictions = tuple(steps.evaluate(val_ds)[2:])  # type: ignore[assignment]
            if predictions is not None:
                matrix = confusion.confusion_matrix(*predictions, len(labels))
                _log_confusion(config.live_dir, live, matrix, labels, predictions)
        except tf.errors.UnimplementedError as exc:
            if not config.deterministic:
                raise
            # Op determinism makes TensorFlow refuse ops it cannot run deterministically
            # (seen: MaxPool gradients under XLA); say which option to change.
            fix = "deterministic false" + (" or jit_compile false" if config.jit_compile else "")
            raise ConfigError(
                f"model {config.model!r} uses an op with no deterministic implementation "
                f"on {device}{' under XLA' if config.jit_compile else ''} "
                f"({str(exc).splitlines()[0]}); use {fix}",
                model=config.model,
            ) from exc
        finally:
            if live is not None:
                live.end()

        metrics = summarize(
            results, device=device, train_records=parts.train_records, val_records=parts.val_records
        )
        metrics.update(
            model=config.model,
            mixed_precision=mixed,
            jit_compile=config.jit_compile,
            replicas=strategy.num_replicas_in_sync,
            strategy=config.strategy,
            seconds=round(time.perf_counter() - started, 2),
        )
        if predictions is not None:
            metrics["val_class_accuracy"] = confusion.class_accuracy(matrix, labels)
        if config.model_out:
            save_model(model, config.model_out)
        if config.export_out:
            export_serving(
                model,
                config.export_out,
                image_size=config.image_size,
                channels=channels,
                image_dtype=config.image_dtype,
                labels=labels,
                scaled_decode=config.scaled_decode,
            )
    write_json(metrics, config.metrics)
    if config.split_out:
        fs, path = storage.open_url(config.split_out)
        storage.write_atomic(fs, path, [parts.to_json()])
    if checkpoint is not None:
        checkpoint.remove()
    return TrainResult(metrics, tuple(results), parts)


def write_json(doc: dict[str, Any], url: str) -> None:
    """Save ``doc`` as sorted, indented JSON, atomically (local path or fsspec URL)."""
    jsonfile.save(doc, url)


def _label_counts(loader: Any, parts: Any, manifest: Any) -> list[int]:
    """Records per class in the training shards (one pass reading only the labels)."""
    import numpy as np

    counts = np.zeros(len(manifest.labels), np.int64)
    labels_only = loader.make_dataset(
        parts.train, manifest, batch_size=4096, training=False, decode=False, features=[]
    )
    for _, y in labels_only:
        counts += np.bincount(y.numpy(), minlength=len(counts))[: len(counts)]
    return [int(c) for c in counts]


def _dataset(
    loader: Any, shards: Sequence[Any], manifest: Any, config: TrainConfig, *, training: bool
) -> Any:
    import tensorflow as tf

    dataset = loader.make_dataset(
        shards,
        manifest,
        batch_size=config.batch_size,
        training=training,
        seed=config.seed,
        image_size=(config.image_size, config.image_size),
        image_dtype=config.image_dtype,
        scaled_decode=config.scaled_decode,
        deterministic=config.deterministic,
    )
    # The checkpointed iterator holds the chunk reader's numpy_functions
    # (tfshards.reading.chunks), which keep no state a resumed run needs: each
    # call reads the chunk its arguments name (a gzip shard inflated from its
    # start again), and a remote shard not yet in the cache is fetched again.
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return dataset.with_options(options)


def _open_live(directory: str | None, *, resume: bool = False) -> Any:
    if directory is None:
        return None
    from dvclive.live import Live
    from scmrepo.exceptions import SCMError

    class _Live(Live):
        def _init_dvc(self) -> None:
            # In a git repository with no commit yet (a new project's first
            # `dvc repro`), dvclive 3.49 asks git for HEAD before its own
            # no-commit check and raises "Empty git repo". With the options
            # below it needs nothing from the repository there (no experiment
            # can be saved without a commit), so log as it does outside git.
            try:
                super()._init_dvc()
            except SCMError:
                self._dvc_repo = None

    # DVC runs this as a stage: dvclive must not edit dvc.yaml, make experiments or reports.
    # resume: the step count goes on from the last logged epoch instead of starting over.
    return _Live(dir=directory, save_dvc_exp=False, dvcyaml=False, report=None, resume=resume)


def _log_confusion(
    directory: str | None,
    live: Any,
    matrix: list[list[int]],
    labels: Sequence[str],
    predictions: tuple[list[int], list[int]],
) -> None:
    """The validation confusion matrix: ``confusion.csv`` and dvclive's plot of it."""
    if directory is None or live is None:
        return
    fs, path = storage.open_url(_confusion_url(directory))
    storage.write_atomic(fs, path, [confusion.to_csv(matrix, labels)])
    actual, predicted = predictions
    live.log_sklearn_plot(
        "confusion_matrix",
        [labels[i] for i in actual],
        [labels[i] for i in predicted],
        name="confusion_matrix.json",
    )
    accuracy = confusion.class_accuracy(matrix, labels)
    live.log_plot(
        "val_class_accuracy",
        [{"label": k, "accuracy": v} for k, v in accuracy.items()],
        x="accuracy",
        y="label",
        template="bar_horizontal",
    )


def _confusion_url(live_dir: str) -> str:
    return f"{live_dir.rstrip('/')}/confusion.csv"


def _log_epoch(
    live: Any, log: Callable[[str], None] | None, result: EpochResult, epochs: int
) -> None:
    metrics = result.metrics()
    if live is not None:
        for name, value in metrics.items():
            live.log_metric(name, value)
        live.next_step()
    if log is not None:
        shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k in MODEL_METRICS)
        log(
            f"epoch {result.epoch}/{epochs}: {shown}, {result.timing.examples_per_s:.0f} "
            f"examples/s, input-bound {result.timing.input_bound_fraction:.0%}"
        )
