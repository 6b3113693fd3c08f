"""``tfshards train``: the ``train`` stage; its options are ``trainconfig.OPTIONS``.

TensorFlow is imported when training starts, not with this module, so
``tfshards train --help`` stays fast and a bad option is said before it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import typer

from tfshards.cli._common import one_line_errors
from tfshards.project import stageoptions
from tfshards.training.trainconfig import OPTIONS, TrainConfig

# Arguments after `--` go to a user's model function: what DVC writes for ${train.model_args}.
CONTEXT = {"allow_extra_args": True}


def _train(values: dict[str, Any]) -> None:
    config = stageoptions.config(TrainConfig, OPTIONS, values)
    from tfshards.training.train import train

    with _without_sklearn():
        result = train(config, log=lambda line: typer.echo(line, err=True))
    typer.echo(result.summary())


@contextlib.contextmanager
def _without_sklearn() -> Iterator[None]:
    """scikit-learn unimportable while this command trains; importable again afterwards.

    Keras imports scikit-learn (when installed) for its sklearn wrappers as
    TensorFlow is imported: 0.9 s of CPU of a 5.1 s import on 2 cores
    (``/usr/bin/time python -c "import tensorflow"``, 3 runs each way). Training
    never uses those wrappers, and dvclive's confusion matrix is written
    without scikit-learn. A process that already imported it keeps it.
    """
    if "sklearn" in sys.modules:
        yield
        return
    sys.modules["sklearn"] = None  # type: ignore[assignment]  # `import sklearn` raises
    try:
        yield
    finally:
        if "sklearn" in sys.modules and sys.modules["sklearn"] is None:
            del sys.modules["sklearn"]


train_command = one_line_errors(
    stageoptions.command(
        OPTIONS,
        _train,
        name="train_command",
        section="train",
        doc="""Train a classifier on the validated shards of --manifest and log its metrics.

    The shards are split into train and validation by whole split buckets
    (seeded). Every epoch logs loss, accuracy, val_loss, val_accuracy,
    examples/s and input_bound_fraction (the share of step time spent waiting
    for data: near 1, the input pipeline is the bottleneck; near 0, the model
    is) to dvclive. On a GPU, mixed precision is on by default and XLA is
    optional; the same code runs on CPU.

    Arguments after -- (--units 64) are passed to a package.module:function model.
    """,
    )
)
