"""A worker's role in a ``multi_worker`` run: the chief writes the outputs, the others not.

Every worker runs every step, every evaluation and every save (a save of a
distributed variable may all-reduce, so all workers take part, as
``MultiWorkerMirroredStrategy`` asks), but only the chief (worker 0) writes
where the user said: the others' metrics, model, export and checkpoints go
to a temporary folder of their own, removed when the run ends, and they
write no dvclive log and no split. A non-chief resumes from a copy of the
chief's checkpoint folder, read at the same path (a shared filesystem); the
workers then check, with one all-reduce, that they all resume at the same
step, and all stop with the same error when they do not.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any

from tfshards.errors import ConfigError
from tfshards.training.checkpoint import MARKER
from tfshards.training.trainconfig import TrainConfig


def worker_config(config: TrainConfig, worker: tuple[int, int]) -> tuple[TrainConfig, str | None]:
    """``config`` as worker ``worker`` runs it, and its temporary folder (None: the chief)."""
    if worker[0] == 0:
        return config, None
    folder = tempfile.mkdtemp(prefix=f"tfshards-worker-{worker[0]}-")
    checkpoint_dir = None
    if config.checkpoint_dir:
        checkpoint_dir = os.path.join(folder, "checkpoints")
        _copy_checkpoint(config.checkpoint_dir, checkpoint_dir)
    own = dataclasses.replace(
        config,
        metrics=os.path.join(folder, "metrics.json"),
        live_dir=None,
        model_out=os.path.join(folder, "model.keras") if config.model_out else None,
        split_out=None,
        export_out=os.path.join(folder, "export") if config.export_out else None,
        checkpoint_dir=checkpoint_dir,
    )
    return own, folder


def remove(folder: str | None) -> None:
    """Remove a non-chief's temporary folder (nothing for the chief)."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def check_same_step(strategy: Any, step: int, checkpoint_dir: str | None) -> None:
    """Raise on every worker unless all resume at training step ``step``.

    One all-reduce of ``step`` and ``step**2`` over the replicas: they are
    all equal exactly when ``replicas * sum(step**2) == sum(step)**2``.
    """
    import tensorflow as tf

    value = tf.constant([step, step * step], tf.float64)
    summed = strategy.reduce(
        tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(value)), axis=None
    ).numpy()
    replicas = strategy.num_replicas_in_sync
    if replicas * summed[1] != summed[0] * summed[0]:
        raise ConfigError(
            f"checkpoint_dir {checkpoint_dir!r}: the workers would resume at different "
            f"steps (this one at {step}, {summed[0] / replicas:g} on average); every worker "
            "must read the chief's checkpoint folder at that path (a shared filesystem), "
            "or remove it to start over",
            option="checkpoint_dir",
        )


def _copy_checkpoint(source: str, target: str) -> None:
    """The chief's checkpoint files (when this worker can read them) into ``target``."""
    os.makedirs(target)
    if not os.path.exists(os.path.join(source, MARKER)):
        return
    for name in os.listdir(source):
        path = os.path.join(source, name)
        if os.path.isfile(path):
            shutil.copy2(path, os.path.join(target, name))
