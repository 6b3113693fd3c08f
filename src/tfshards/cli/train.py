"""``tfshards train``: the ``train`` stage (also run by ``stages/train.py``).

TensorFlow is imported when training starts, not with this module, so
``tfshards --help`` stays fast.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tfshards.cli._common import one_line_errors
from tfshards.models import MODELS
from tfshards.train import MIXED_PRECISION, TrainConfig

DEFAULTS = TrainConfig()
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def parse_bool(value: str, option: str) -> bool:
    """``true``/``false`` (and yes/no, on/off, 1/0): what DVC writes for ``${section.flag}``."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise typer.BadParameter(f"expected true or false, got {value!r}", param_hint=option)


@one_line_errors
def train_command(
    manifest: Annotated[
        str, typer.Option(help="manifest.json of the validated shards (path or fsspec URL).")
    ] = DEFAULTS.manifest,
    model: Annotated[
        str,
        typer.Option(help=f"Model to train: {' | '.join(MODELS)}."),
    ] = DEFAULTS.model,
    epochs: Annotated[int, typer.Option(help="Passes over the training shards.")] = (
        DEFAULTS.epochs
    ),
    batch_size: Annotated[int, typer.Option(help="Records per training step.")] = (
        DEFAULTS.batch_size
    ),
    learning_rate: Annotated[float, typer.Option(help="Adam learning rate.")] = (
        DEFAULTS.learning_rate
    ),
    image_size: Annotated[
        int,
        typer.Option(
            help="Images are resized to SIZE x SIZE (small_cnn >= 8, mobilenet_v3_small >= 32)."
        ),
    ] = DEFAULTS.image_size,
    val_fraction: Annotated[
        float, typer.Option(help="Share of records held out for validation, as whole shards.")
    ] = DEFAULTS.val_fraction,
    seed: Annotated[
        int, typer.Option(help="Seeds Python, NumPy, TensorFlow, the split and the input order.")
    ] = DEFAULTS.seed,
    deterministic: Annotated[
        str,
        typer.Option(
            metavar="BOOL",
            help="true: the same seed gives the same run (op determinism, fixed input order); "
            "false: faster on GPU.",
        ),
    ] = "true",
    mixed_precision: Annotated[
        str,
        typer.Option(help=f"{' | '.join(MIXED_PRECISION)}: float16 compute; auto = on a GPU only."),
    ] = DEFAULTS.mixed_precision,
    jit_compile: Annotated[
        str, typer.Option(metavar="BOOL", help="true: compile the steps with XLA.")
    ] = "false",
    metrics: Annotated[
        str, typer.Option(help="Summary metrics JSON (the DVC metrics file).")
    ] = DEFAULTS.metrics,
    live_dir: Annotated[
        str, typer.Option(help="dvclive directory: per-epoch metrics and plots.")
    ] = str(DEFAULTS.live_dir),
    model_out: Annotated[str, typer.Option(help="Where to save the trained model (.keras).")] = str(
        DEFAULTS.model_out
    ),
    split_out: Annotated[
        str, typer.Option(help="Where to save the train/val split (shards and records per side).")
    ] = str(DEFAULTS.split_out),
) -> None:
    """Train a classifier on the validated shards of --manifest and log its metrics.

    The shards are split into train and validation by whole files (seeded).
    Every epoch logs loss, accuracy, val_loss, val_accuracy, examples/s and
    input_bound_fraction (the share of step time spent waiting for data: near
    1, the input pipeline is the bottleneck; near 0, the model is) to dvclive.
    On a GPU, mixed precision is on by default and XLA is optional; the same
    code runs on CPU.
    """
    config = TrainConfig(
        manifest=manifest,
        model=model,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        image_size=image_size,
        val_fraction=val_fraction,
        seed=seed,
        deterministic=parse_bool(deterministic, "--deterministic"),
        mixed_precision=mixed_precision,
        jit_compile=parse_bool(jit_compile, "--jit-compile"),
        metrics=metrics,
        live_dir=live_dir,
        model_out=model_out,
        split_out=split_out,
    )
    from tfshards.train import train

    result = train(config, log=lambda line: typer.echo(line, err=True))
    typer.echo(result.summary())
