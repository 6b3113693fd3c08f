"""Train a classifier on a manifest's shards, timing how long each step waits for data.

The loop is written out (not ``model.fit``) so the wait for data can be timed
where it happens: Keras pulls batches inside its compiled train function, out
of reach of Python. Per step, the time blocked in ``next(iterator)`` is the
input stall; the epoch's wall time is the whole. Their ratio is the
``input_bound_fraction`` (see :mod:`tfshards.stall`). TensorFlow is imported on
first use, so :class:`TrainConfig` loads in milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import manifest as manifests
from tfshards import models, storage
from tfshards.errors import ConfigError
from tfshards.stall import LoopTiming, timed_loop  # re-exported: train's API before the split

MIXED_PRECISION = ("auto", "on", "off")
MODEL_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")  # val_* need a val set

__all__ = [
    "MIXED_PRECISION",
    "MODEL_METRICS",
    "EpochResult",
    "LoopTiming",
    "TrainConfig",
    "TrainResult",
    "device_name",
    "save_model",
    "summarize",
    "timed_loop",
    "train",
    "write_json",
]


@dataclass(frozen=True)
class TrainConfig:
    """What to train and where its outputs go; validated on construction.

    Attributes:
        manifest: manifest.json of the shard set (path or fsspec URL).
        model: a name in :data:`tfshards.models.MODELS`.
        epochs: passes over the training shards, >= 1.
        batch_size: records per step, >= 1.
        learning_rate: Adam's step size, > 0.
        image_size: height = width the images are resized to, in pixels.
        val_fraction: share of records (whole shards) held out, in [0, 1).
        seed: seeds Python, NumPy, TensorFlow, the split and the input order.
        deterministic: same seed, same result: op determinism and a fixed input order.
        mixed_precision: ``"auto"`` (on when a GPU is present), ``"on"`` or ``"off"``.
        jit_compile: compile the train and eval steps with XLA.
        metrics: summary JSON (the DVC metrics file).
        live_dir: dvclive directory for per-epoch metrics, or None.
        model_out: where the trained model goes (``.keras``), or None.
        split_out: where the split (shards and records per side) goes, or None.
    """

    manifest: str = "data/manifest.json"
    model: str = "small_cnn"
    epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 1e-3
    image_size: int = 16
    val_fraction: float = 0.2
    seed: int = 0
    deterministic: bool = True
    mixed_precision: str = "auto"
    jit_compile: bool = False
    metrics: str = "results/train/metrics.json"
    live_dir: str | None = "results/train/live"
    model_out: str | None = "models/model.keras"
    split_out: str | None = "results/train/split.json"

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "image_size"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}", option=name)
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ConfigError(
                f"mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}"
            )
        if self.model_out is not None and not self.model_out.endswith(".keras"):
            raise ConfigError(f"model_out must end with .keras, got {self.model_out!r}")
        models.model_spec(self.model, self.image_size)


@dataclass(frozen=True)
class EpochResult:
    """One epoch's metrics (val ones are None without a validation set) and its timing."""

    epoch: int
    loss: float
    accuracy: float
    val_loss: float | None
    val_accuracy: float | None
    timing: LoopTiming

    def metrics(self) -> dict[str, float]:
        values = {
            "loss": self.loss,
            "accuracy": self.accuracy,
            "val_loss": self.val_loss,
            "val_accuracy": self.val_accuracy,
            "examples_per_s": self.timing.examples_per_s,
            "input_bound_fraction": self.timing.input_bound_fraction,
        }
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` did: the summary metrics, every epoch, and the split."""

    metrics: dict[str, Any]
    epochs: tuple[EpochResult, ...]
    split: Any  # tfshards.loader.Split

    def summary(self) -> str:
        m = self.metrics
        val = f"val_accuracy {m['val_accuracy']:.4f}, " if "val_accuracy" in m else ""
        return (
            f"trained {m['model']} for {m['epochs']} epochs on {m['train_records']} records: "
            f"{val}accuracy {m['accuracy']:.4f}, {m['examples_per_s']:.0f} examples/s, "
            f"input-bound {m['input_bound_fraction']:.0%}, on {m['device']} in {m['seconds']:.1f}s"
        )


def summarize(
    epochs: Sequence[EpochResult], *, device: str, train_records: int, val_records: int
) -> dict[str, Any]:
    """The summary metrics: the last epoch's model metrics, steady-state timings.

    Timings leave out the first epoch when there are more (it traces and
    compiles the steps and fills the input pipeline), so ``examples_per_s``
    and ``input_bound_fraction`` describe the run's steady state.
    """
    if not epochs:
        raise ConfigError("no epochs to summarize")
    last = epochs[-1]
    steady = epochs[1:] or epochs
    timing = steady[0].timing
    for epoch in steady[1:]:
        timing = timing + epoch.timing
    out: dict[str, Any] = {k: round(v, 6) for k, v in last.metrics().items() if k in MODEL_METRICS}
    out.update(
        epochs=len(epochs),
        examples_per_s=round(timing.examples_per_s, 1),
        input_bound_fraction=round(timing.input_bound_fraction, 4),
        device=device,
        train_records=train_records,
        val_records=val_records,
    )
    return out


def device_name() -> str:
    """``"GPU:0 (<name>)"`` when TensorFlow sees a GPU (steps run there), else ``"CPU"``."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    details = tf.config.experimental.get_device_details(gpus[0])
    return f"GPU:0 ({details.get('device_name', 'unknown')})"


def train(config: TrainConfig, *, log: Callable[[str], None] | None = None) -> TrainResult:
    """Train ``config.model`` on the manifest's shards and write every output.

    Splits the shards (whole files) into train and validation, trains with
    Adam on sparse categorical cross-entropy, evaluates after every epoch,
    logs per-epoch metrics to dvclive, then writes the summary metrics, the
    split and the model. Global TensorFlow state it changes (dtype policy, op
    determinism) is restored on return.

    Args:
        config: what to train.
        log: called with one line per epoch (None: silent).
    """
    import keras
    import tensorflow as tf

    from tfshards import loader

    started = time.perf_counter()
    manifest = manifests.load(config.manifest)
    if len(manifest.labels) < 2:
        raise ConfigError(
            f"{config.manifest}: a classifier needs at least 2 labels, found {len(manifest.labels)}"
        )
    parts = loader.split(manifest, config.val_fraction, config.seed)
    device = device_name()
    mixed = config.mixed_precision == "on" or (config.mixed_precision == "auto" and device != "CPU")
    # Seeds first: tf.data ops take the global seed into theirs when they are made.
    with _tf_state(tf, keras, seed=config.seed, deterministic=config.deterministic, mixed=mixed):
        # Training: endless, one iterator for all epochs (the pipeline never restarts).
        train_ds = _dataset(loader, parts.train, manifest, config, training=True)
        val_ds = (
            _dataset(loader, parts.val, manifest, config, training=False) if parts.val else None
        )
        model = models.build_model(
            config.model,
            image_size=config.image_size,
            channels=int(train_ds.element_spec[0].shape[-1]),
            classes=len(manifest.labels),
        )
        steps = models.TrainSteps(
            model, config.learning_rate, mixed=mixed, jit_compile=config.jit_compile
        )
        batches = max(1, parts.train_records // config.batch_size)
        live = _open_live(config.live_dir)
        results: list[EpochResult] = []
        try:
            with loader.shard_errors(manifest, parts.train + parts.val):
                iterator = iter(train_ds)
                for epoch in range(1, config.epochs + 1):
                    timing = timed_loop(
                        iterator,
                        batches,
                        lambda b: steps.train(b[0], b[1]),
                        count=lambda b: int(b[1].shape[0]),
                        sync=lambda loss: loss.numpy(),
                    )
                    loss, accuracy = steps.train_metrics()
                    val_loss, val_accuracy = steps.evaluate(val_ds) if val_ds else (None, None)
                    result = EpochResult(epoch, loss, accuracy, val_loss, val_accuracy, timing)
                    results.append(result)
                    _log_epoch(live, log, result, config.epochs)
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
            seconds=round(time.perf_counter() - started, 2),
        )
        if config.model_out:
            save_model(model, config.model_out)
    write_json(metrics, config.metrics)
    if config.split_out:
        fs, path = storage.open_url(config.split_out)
        storage.write_atomic(fs, path, [parts.to_json()])
    return TrainResult(metrics, tuple(results), parts)


def write_json(doc: dict[str, Any], url: str) -> None:
    """Save ``doc`` as sorted, indented JSON, atomically (local path or fsspec URL)."""
    fs, path = storage.open_url(url)
    text = json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    storage.write_atomic(fs, path, [text.encode()])


def save_model(model: Any, url: str) -> None:
    """Save a Keras model as ``.keras`` at ``url`` (local or fsspec), atomically."""
    with tempfile.TemporaryDirectory(prefix="tfshards-model-") as tmp:
        local = os.path.join(tmp, "model.keras")  # Keras writes only to local files
        model.save(local)
        with open(local, "rb") as f:
            data = f.read()
    fs, path = storage.open_url(url)
    storage.write_atomic(fs, path, [data])


def _dataset(
    loader: Any, shards: Sequence[Any], manifest: Any, config: TrainConfig, *, training: bool
) -> Any:
    return loader.make_dataset(
        shards,
        manifest,
        batch_size=config.batch_size,
        training=training,
        seed=config.seed,
        image_size=(config.image_size, config.image_size),
        deterministic=config.deterministic,
    )


@contextlib.contextmanager
def _tf_state(
    tf: Any, keras: Any, *, seed: int, deterministic: bool, mixed: bool
) -> Iterator[None]:
    """Seeds, op determinism and the dtype policy for one run; process-wide, so restored after."""
    from tensorflow.python.framework import config as tf_config

    policy = keras.mixed_precision.global_policy()
    was_deterministic = tf_config.is_op_determinism_enabled()
    keras.utils.set_random_seed(seed)  # Python, NumPy and TensorFlow
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(policy)
        if deterministic and not was_deterministic:
            tf_config.disable_op_determinism()


def _open_live(directory: str | None) -> Any:
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
    return _Live(dir=directory, save_dvc_exp=False, dvcyaml=False, report=None)


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
