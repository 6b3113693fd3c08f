"""Train a classifier on a manifest's shards, timing how long each step waits for data.

The loop is written out (not ``model.fit``) so the wait for data can be timed
where it happens: Keras pulls batches inside its compiled train function, out
of reach of Python. Per step, the time blocked in ``next(iterator)`` is the
input stall; the epoch's wall time is the whole. Their ratio is the
``input_bound_fraction`` (see :mod:`tfshards.training.stall`). TensorFlow is imported on
first use, so :class:`TrainConfig` loads in milliseconds.

:func:`train` runs named steps, each handing the next a frozen value:
:func:`_load` (manifest and split, before TensorFlow) -> :func:`_place`
(:class:`Placement`) -> :func:`traindata.prepare` (:class:`TrainData`) ->
:func:`_build` (:class:`TrainSteps`) -> :func:`_fit` (:class:`Fitted`) ->
:func:`_finish` (the metrics, the model files) -> :func:`_write_outputs`.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import atomicfile, heavyimport, jsonfile, storage
from tfshards.errors import ConfigError, InputError, RecordError
from tfshards.shardset import manifest as manifests
from tfshards.shardset import members
from tfshards.shardset.manifest import Manifest
from tfshards.shardset.split import Split, split
from tfshards.training import (
    confusion,
    devices,
    live,
    models,
    optim,
    outputs,
    traindata,
    workerrole,
)
from tfshards.training.batchtrace import from_env as batch_trace
from tfshards.training.checkpoint import Checkpoint, settings_key
from tfshards.training.epochloop import EpochLoop
from tfshards.training.export import export_serving, save_model
from tfshards.training.history import (
    MODEL_METRICS,
    EpochResult,
    early_stop_note,
    stop_early,
    summarize,
)
from tfshards.training.stall import LoopTiming
from tfshards.training.steps import TrainSteps
from tfshards.training.trainconfig import TrainConfig
from tfshards.training.traindata import TrainData
from tfshards.training.trainmix import Mix, load_sets

__all__ = [
    "TrainResult",
    "train",
]

# The metrics a user compares first lead the metrics file, as `dvc exp show` lists them;
# per-class accuracy is a plot (live/plots/custom/val_class_accuracy.json), not columns.
FIRST_METRICS = ("val_accuracy", "val_loss", "accuracy", "loss", "epochs")
Predictions = tuple[list[int], list[int]]  # (actual, predicted) class ids of the val records


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
            f"trained {m['model']} for {m['epochs']} epoch{'' if m['epochs'] == 1 else 's'} on "
            f"{m['train_records']} records: "
            f"{val}accuracy {m['accuracy']:.4f}, {m['examples_per_s']:.0f} examples/s, "
            f"input-bound {m['input_bound_fraction']:.0%}, on {m['device']} in {m['seconds']:.1f}s"
        )


@dataclass(frozen=True)
class Placement:
    """Where the steps run: the device's name, float16 compute or not, the strategy, and
    ``(index, count)`` of this worker (``(0, 1)`` unless ``multi_worker``; 0 is the chief)."""

    device: str
    mixed: bool
    strategy: Any  # a tf.distribute.Strategy
    worker: tuple[int, int] = (0, 1)


@dataclass(frozen=True)
class Fitted:
    """What the epochs left: every epoch's result, the last val predictions and their matrix."""

    results: tuple[EpochResult, ...]
    predictions: Predictions | None
    matrix: list[list[int]]
    checkpoint: Checkpoint | None


def train(
    config: TrainConfig,
    *,
    log: Callable[[str], None] | None = None,
    on_batch: Callable[[int, Any], None] | None = None,
) -> TrainResult:
    """Train ``config.model`` on the manifest's shards and write every output.

    Splits the shards (whole files) into train and validation, trains on
    (weighted, smoothed) cross-entropy, evaluates after every epoch, logs
    per-epoch metrics to dvclive and checkpoints, resuming after the last
    checkpoint of a killed run with the same settings (after an epoch, or
    mid-epoch every ``checkpoint_every_steps``). Then writes the
    validation confusion matrix, the summary metrics, the split, the model and
    its serving export, and removes the checkpoint. Global TensorFlow state it
    changes (dtype policy, op determinism) is restored on return.

    Args:
        config: what to train.
        log: called with one line per epoch (None: silent).
        on_batch: called with the training step's number (from 0, counted over
            epochs) and its batch, before the step (a test's hook; without it,
            :mod:`tfshards.training.batchtrace` may trace the steps).

    Under ``strategy: multi_worker`` every worker runs this; only the chief
    writes the outputs (:mod:`tfshards.training.workerrole`).
    """
    started = time.perf_counter()
    manifest, parts, mix = _load(config)
    # Before any epoch: an output replaces only what a run wrote, never an input.
    outputs.check(config, mix.manifests if mix is not None else [manifest])
    placement = _place(config, log)
    config, own_folder = workerrole.worker_config(config, placement.worker)
    try:
        # Seeds first: tf.data ops take the global seed into theirs when they are made.
        mixed = placement.mixed
        with devices.tf_state(config.seed, deterministic=config.deterministic, mixed=mixed):
            data = traindata.prepare(config, manifest, parts, placement.strategy, mix)
            _say_oversized_batch(config, parts, mix, log)
            steps = _build(config, data, placement)
            if on_batch is None:
                local = placement.strategy.experimental_local_results
                on_batch = batch_trace(placement.worker[0], local)
            fitted = _fit(config, data, steps, placement, log, on_batch)
            metrics = _finish(config, data, placement, steps, fitted, started)
        _write_outputs(config, metrics, parts, fitted.checkpoint)
    except RecordError as exc:
        if "does not decode as an image" not in str(exc):
            raise
        raise RecordError(  # write reads headers only: validate could have said so
            f"{exc}; `validate.decode: true` (validate --decode) finds such records before "
            "training: replace or remove the file, and run the pipeline again",
            shard=exc.shard,
            index=exc.index,
            offset=exc.offset,
        ) from exc
    finally:
        workerrole.remove(own_folder)
    return TrainResult(metrics, fitted.results, parts)


def _load(config: TrainConfig) -> tuple[Manifest, Split, Mix | None]:
    """The user model, the manifest (both checked before TensorFlow's 3-5 s import), the splits."""
    if models.is_user_model(config.model):
        models.load_builder(config.model)  # a bad module fails before any data is read
    manifest = manifests.load(config.manifest)
    labels = manifest.labels
    if len(labels) < 2:
        raise ConfigError(
            f"{config.manifest}: a classifier needs at least 2 labels, found {len(labels)}"
        )
    present = _labels_with_records(manifest)
    if len(present) < 2:  # a map of numbers ("0".."3") named labels no folder held
        names = ", ".join(repr(labels[i]) for i in sorted(present)) or "none"
        raise ConfigError(
            f"{config.manifest}: a classifier needs records of at least 2 labels, found "
            f"records of {len(present)} ({names}) of the {len(labels)} in its label map"
        )
    heavyimport.load("tensorflow", "keras")  # a missing install is said before the split's warnings

    seed = config.seed if config.split_seed is None else config.split_seed
    parts = split(manifest, config.val_fraction, seed)
    mix = load_sets(config.manifest, manifest, parts, config.mix, config.val_fraction, seed)
    return manifest, parts, mix


def _labels_with_records(manifest: Manifest, enough: int = 2) -> set[int]:
    """Label ids that records carry, read from the member lists until ``enough`` are seen
    (one small file a shard: the first often settles it). Without member lists (older
    sets) or when they cannot be read, every id counts: the check is left to the labels."""
    found: set[int] = set()
    try:
        fs, version = storage.open_url(manifest.directory)
        for shard in manifest.shards:
            if shard.records_sha256 is None:
                return set(range(len(manifest.labels)))
            found.update(int(row[2]) for row in members.load(fs, version, shard))
            if len(found) >= enough:
                break
    except (OSError, InputError):  # the loader names a missing or damaged file better
        return set(range(len(manifest.labels)))
    return found


def _place(config: TrainConfig, log: Callable[[str], None] | None) -> Placement:
    """The device, the precision (``auto``: float16 on a GPU) and the strategy."""
    strategy = devices.make_strategy(config.strategy)  # first: before any other op (MWMS)
    device = devices.device_name()
    mixed = config.mixed_precision == "on" or (config.mixed_precision == "auto" and device != "CPU")
    if config.strategy == "mirrored" and strategy.num_replicas_in_sync == 1 and log is not None:
        log(f"strategy mirrored: one device found ({device}), so one replica trains")
    worker = devices.worker_of(strategy) if config.strategy == "multi_worker" else (0, 1)
    if config.strategy == "multi_worker" and worker[1] == 1 and log is not None:
        log("strategy multi_worker: TF_CONFIG names no other worker, so this one trains alone")
    if worker[1] > 1 and log is not None:
        log(f"strategy multi_worker: worker {worker[0]} of {worker[1]} (0 writes the outputs)")
    return Placement(device, mixed, strategy, worker)


def _epoch_records(data: TrainData) -> int:
    """Records an epoch trains on: the training side, or a mixed epoch's of every set."""
    if data.mix is None:
        return data.parts.train_records
    from tfshards.reading import mixing

    return mixing.plan_of(data.mix.sources()).epoch_size


def _build(config: TrainConfig, data: TrainData, placement: Placement) -> TrainSteps:
    """The model, its optimizer and their compiled steps, made under the strategy."""
    classes = len(data.manifest.labels)
    with placement.strategy.scope():
        model = models.with_input(
            models.build_model(
                config.model,
                image_size=config.image_size,
                channels=data.channels,
                classes=classes,
                model_args=config.model_args,
            ),
            image_dtype=config.image_dtype,
            augment=config.augment,
            seed=config.seed,
        )
        rate = optim.learning_rate(
            config.learning_rate,
            config.lr_schedule,
            total_steps=data.batches * config.epochs,
            warmup_steps=data.batches * config.warmup_epochs,
        )
        optimizer = optim.make_optimizer(
            config.optimizer, rate, momentum=config.momentum, weight_decay=config.weight_decay
        )
    return TrainSteps(
        model,
        optimizer,
        strategy=placement.strategy,
        classes=classes,
        global_batch=config.batch_size,
        label_smoothing=config.label_smoothing,
        class_weights=data.class_weights,
        mixed=placement.mixed,
        jit_compile=config.jit_compile,
        per_replica_input=data.distributed,
    )


def _fit(
    config: TrainConfig,
    data: TrainData,
    steps: TrainSteps,
    placement: Placement,
    log: Callable[[str], None] | None,
    on_batch: Callable[[int, Any], None] | None,
) -> Fitted:
    """Every step a checkpoint does not hold yet, epochs logged; then the val confusion matrix."""
    import tensorflow as tf

    from tfshards.reading.corruption import shard_errors

    checkpoint, results = _resume(config, data, steps, placement, log)
    done = max(0 if checkpoint is None else checkpoint.step, len(results) * data.batches)
    train = data.train
    if done:  # the input starts where the checkpoint's steps ended
        strategy = placement.strategy
        train = traindata.train_stream(config, data.manifest, data.parts, strategy, done, data.mix)
    iterator = iter(train)  # one for all epochs: the pipeline never restarts
    count = (lambda batch: steps.records(batch[1])) if data.distributed else None
    log_live = live.start(config.live_dir, resumed=len(results))
    labels = data.manifest.labels
    predictions: Predictions | None = None
    matrix: list[list[int]] = []
    try:
        with shard_errors(data.manifest, data.parts.train + data.parts.val):
            for epoch in range(len(results) + 1, config.epochs + 1):
                if stop_early(results, config.early_stopping, config.early_stopping_metric):
                    _say_stopped(config, results, steps, log)
                    break
                save = None
                if checkpoint is not None:
                    history = [r.to_json() for r in results]
                    save = functools.partial(checkpoint.save, epoch - 1, history)
                loop = EpochLoop(
                    steps, iterator, data.batches, config.checkpoint_every_steps, count
                )
                result, predictions = _epoch(data, steps, loop.epoch(epoch, done, save, on_batch))
                done = epoch * data.batches
                results.append(result)
                live.log_epoch(log_live, result)
                if checkpoint is not None:
                    checkpoint.save(epoch, [r.to_json() for r in results], step=done)
                _say_epoch(log, result, config.epochs)
            if data.val is not None and predictions is None:  # all epochs were done before
                _, _, actual, predicted = steps.evaluate(data.val)
                predictions = (actual, predicted)
        if predictions is not None:
            matrix = confusion.confusion_matrix(*predictions, len(labels))
            live.log_confusion(config.live_dir, log_live, matrix, labels, predictions)
    except tf.errors.UnimplementedError as exc:
        if not config.deterministic:
            raise
        raise devices.no_deterministic_kernel(
            config.model, placement.device, exc, jit_compile=config.jit_compile
        ) from exc
    except tf.errors.InvalidArgumentError as exc:  # no record at fault: what it was used for
        raise InputError(
            f"{data.manifest.directory}: training stopped: {_tf_words(exc.message)} "
            "(tfshards validate checks every record; --scaled-decode false decodes each "
            "image whole, whatever its format)"
        ) from exc
    finally:
        if log_live is not None:
            log_live.end()
    return Fitted(tuple(results), predictions, matrix, checkpoint)


def _tf_words(message: str) -> str:
    """A TensorFlow error's own words: its first line, without the graph node and the
    ``tf.data`` iterator that ran it."""
    first = message.strip().splitlines()[0] if message.strip() else "an error"
    first = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", first)
    first = re.sub(r"^Error in user-defined function .*?Iterator::\S+: ", "", first)
    return first.split(" [[")[0]


def _epoch(
    data: TrainData, steps: TrainSteps, trained: tuple[int, LoopTiming]
) -> tuple[EpochResult, Predictions | None]:
    """An epoch trained, evaluated: its result and the val predictions (None without val)."""
    epoch, timing = trained
    loss, accuracy = steps.train_metrics()
    if data.val is None:
        return EpochResult(epoch, loss, accuracy, None, None, timing), None
    val_loss, val_accuracy, actual, predicted = steps.evaluate(data.val)
    return EpochResult(epoch, loss, accuracy, val_loss, val_accuracy, timing), (actual, predicted)


def _finish(
    config: TrainConfig,
    data: TrainData,
    placement: Placement,
    steps: TrainSteps,
    fitted: Fitted,
    started: float,
) -> dict[str, Any]:
    """The summary metrics; then the model and its serving export are saved."""
    parts = data.parts
    metrics = summarize(
        fitted.results,
        device=placement.device,
        train_records=_epoch_records(data),
        val_records=parts.val_records,
    )
    metrics.update(
        model=config.model,
        mixed_precision=placement.mixed,
        jit_compile=config.jit_compile,
        replicas=placement.strategy.num_replicas_in_sync,
        strategy=config.strategy,
        **({"workers": placement.worker[1]} if config.strategy == "multi_worker" else {}),
        **({"mix_sources": data.mix.metric()} if data.mix else {}),
        seconds=round(time.perf_counter() - started, 2),
    )
    if config.model_out:
        save_model(steps.model, config.model_out)
    if config.export_out:
        export_serving(
            steps.model,
            config.export_out,
            image_size=config.image_size,
            channels=data.channels,
            image_dtype=config.image_dtype,
            labels=data.manifest.labels,
            scaled_decode=config.scaled_decode,
        )
    return metrics


def _write_outputs(
    config: TrainConfig, metrics: dict[str, Any], parts: Split, checkpoint: Checkpoint | None
) -> None:
    """The metrics and the split; the checkpoint is removed only after both are written."""
    first = {k: metrics[k] for k in FIRST_METRICS if k in metrics}
    jsonfile.save_metrics({**first, **metrics}, config.metrics)
    if config.split_out:
        fs, path = storage.open_url(config.split_out)
        atomicfile.write_atomic(fs, path, [parts.to_json()])
    if checkpoint is not None:
        checkpoint.remove()


def _resume(
    config: TrainConfig,
    data: TrainData,
    steps: TrainSteps,
    placement: Placement,
    log: Callable[[str], None] | None,
) -> tuple[Checkpoint | None, list[EpochResult]]:
    """The checkpoint (None without ``checkpoint_dir``) and the epochs it restored."""
    if not config.checkpoint_dir:
        return None, []
    # The manifest by its content (fingerprint), not its path: `m.json` and `$PWD/m.json`
    # name one set, and a run given either resumes the other's checkpoint.
    # Each mixed set likewise: by fingerprint and weight, its path left out.
    settings = {k: v for k, v in config.settings().items() if k not in ("manifest", "mix")}
    settings["fingerprint"] = data.manifest.fingerprint
    if config.strategy == "multi_worker":  # the input's position is per worker
        settings["workers"] = placement.worker[1]
    if data.mix:
        settings["mix_fingerprints"] = data.mix.fingerprints()
        settings["mix_weights"] = list(data.mix.weights)
    settings["input"] = "epoch order"  # not an iterator's state
    checkpoint = Checkpoint(
        config.checkpoint_dir,
        settings_key(settings),
        {
            "model": [v.value for v in steps.model.variables],
            "optimizer": [v.value for v in steps.optimizer.variables],
            "metrics": [v.value for m in (steps.loss, steps.accuracy) for v in m.variables],
        },
        settings=settings,
    )
    done, history = checkpoint.restore(log if placement.worker[0] == 0 else None)
    if config.strategy == "multi_worker":
        workerrole.check_same_step(placement.strategy, checkpoint.step, config.checkpoint_dir)
    results = [EpochResult.from_json(doc) for doc in history]
    into = checkpoint.step - done * data.batches
    if log is not None and into > 0:
        log(
            f"resuming in epoch {done + 1}/{config.epochs} after step {checkpoint.step} "
            f"from {config.checkpoint_dir}"
        )
    elif done and log is not None:
        log(f"resuming after epoch {done}/{config.epochs} from {config.checkpoint_dir}")
    return checkpoint, results


def _say_oversized_batch(
    config: TrainConfig, parts: Split, mix: Mix | None, log: Callable[[str], None] | None
) -> None:
    """One line when a batch holds more records than the training side (the mixed epoch,
    with a mix): an epoch is then one step that repeats them (1,479 records in a batch of
    5,000: ~3.4 passes a step)."""
    if log is None:
        return
    if mix is None:
        records, what = parts.train_records, "training records"
    else:
        from tfshards.reading import mixing

        records, what = mixing.plan_of(mix.sources()).epoch_size, "records of a mixed epoch"
    if not 0 < records < config.batch_size:
        return
    log(
        f"batch_size {config.batch_size} is above the {records} {what}: each "
        f"epoch is one step repeating them ({config.batch_size / records:.1f} passes); "
        "a smaller batch_size gives more steps an epoch"
    )


def _say_stopped(
    config: TrainConfig,
    results: Sequence[EpochResult],
    steps: TrainSteps,
    log: Callable[[str], None] | None,
) -> None:
    if log is None:
        return
    rate = float(steps.optimizer.learning_rate)
    note = early_stop_note(
        results, config.early_stopping, config.early_stopping_metric, config.epochs
    )
    log(f"{note}; learning rate at the stop {rate:.3g}")


def _say_epoch(log: Callable[[str], None] | None, result: EpochResult, epochs: int) -> None:
    if log is None:
        return
    shown = " ".join(f"{k} {v:.4f}" for k, v in result.metrics().items() if k in MODEL_METRICS)
    log(
        f"epoch {result.epoch}/{epochs}: {shown}, {result.timing.examples_per_s:.0f} "
        f"examples/s, input-bound {result.timing.input_bound_fraction:.0%}"
    )
