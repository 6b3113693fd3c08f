"""``tfshards train``: the ``train`` stage (also run by ``stages/train.py``).

TensorFlow is imported when training starts, not with this module, so
``tfshards --help`` stays fast.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tfshards.cli._common import one_line_errors
from tfshards.project.stageoptions import optional_int, parse_bool
from tfshards.training.devices import STRATEGIES
from tfshards.training.models import AUGMENTATIONS, MODELS
from tfshards.training.optim import CLASS_WEIGHTS, OPTIMIZERS, SCHEDULES
from tfshards.training.trainconfig import MIXED_PRECISION, TrainConfig

DEFAULTS = TrainConfig()
# Arguments after `--` go to a user's model function: what DVC writes for ${train.model_args}.
CONTEXT = {"allow_extra_args": True}


def parse_model_args(args: list[str]) -> dict[str, Any]:
    """``--name value`` pairs (DVC's rendering of a params mapping) as keyword arguments.

    A value is read as JSON when it is JSON (``3``, ``0.5``, ``true``), else
    kept as text; ``--name`` alone is ``True``; several values make a list.
    """
    out: dict[str, Any] = {}
    name = None
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:
            name = arg[2:].replace("-", "_")
            out[name] = True
        elif name is None:
            raise typer.BadParameter(
                f"expected --name value pairs for the model, got {arg!r}", param_hint="model args"
            )
        else:
            value = _scalar(arg)
            current = out[name]
            out[name] = value if current is True else [*_listed(current), value]
    return out


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@one_line_errors
def train_command(
    ctx: typer.Context,
    manifest: Annotated[
        str, typer.Option(help="manifest.json of the validated shards (path or fsspec URL).")
    ] = DEFAULTS.manifest,
    model: Annotated[
        str,
        typer.Option(
            help=f"Model to train: {' | '.join(MODELS)}, or package.module:function "
            "(called with the input shape, the class count and the arguments after --)."
        ),
    ] = DEFAULTS.model,
    epochs: Annotated[int, typer.Option(help="Passes over the training shards.")] = (
        DEFAULTS.epochs
    ),
    batch_size: Annotated[int, typer.Option(help="Records per training step.")] = (
        DEFAULTS.batch_size
    ),
    learning_rate: Annotated[
        float, typer.Option(help="Learning rate (the peak one under a schedule).")
    ] = DEFAULTS.learning_rate,
    optimizer: Annotated[str, typer.Option(help=f"{' | '.join(OPTIMIZERS)}.")] = (
        DEFAULTS.optimizer
    ),
    momentum: Annotated[float, typer.Option(help="sgd's momentum.")] = DEFAULTS.momentum,
    weight_decay: Annotated[float, typer.Option(help="adamw's decoupled weight decay.")] = (
        DEFAULTS.weight_decay
    ),
    lr_schedule: Annotated[
        str, typer.Option(help=f"{' | '.join(SCHEDULES)}: cosine decays to 0 at the last step.")
    ] = DEFAULTS.lr_schedule,
    warmup_epochs: Annotated[
        int, typer.Option(help="Epochs of linear warm-up from 0 (cosine only).")
    ] = DEFAULTS.warmup_epochs,
    early_stopping: Annotated[
        int,
        typer.Option(help="Stop after N epochs without a better --early-stopping-metric; 0: off."),
    ] = DEFAULTS.early_stopping,
    early_stopping_metric: Annotated[
        str, typer.Option(help="val_loss | val_accuracy.")
    ] = DEFAULTS.early_stopping_metric,
    label_smoothing: Annotated[
        float, typer.Option(help="Share of the target spread over all classes, in [0, 1).")
    ] = DEFAULTS.label_smoothing,
    class_weight: Annotated[
        str,
        typer.Option(
            help=f"{' | '.join(CLASS_WEIGHTS)}: balanced weighs classes by the inverse of "
            "their training record counts."
        ),
    ] = DEFAULTS.class_weight,
    augment: Annotated[
        str,
        typer.Option(
            help=f"none, or comma-separated among {', '.join(AUGMENTATIONS)}: random "
            "horizontal flip, random crop resized back; on the device, training only."
        ),
    ] = "none",
    image_dtype: Annotated[
        str,
        typer.Option(
            help="float32 | uint8: uint8 sends a quarter of the bytes, scaled in the model."
        ),
    ] = DEFAULTS.image_dtype,
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
        int, typer.Option(help="Seeds Python, NumPy, TensorFlow and the input order.")
    ] = DEFAULTS.seed,
    split_seed: Annotated[
        str,
        typer.Option(
            metavar="INT|none", help="Picks the validation shards; none: the same as --seed."
        ),
    ] = "none",
    deterministic: Annotated[
        str,
        typer.Option(
            metavar="BOOL",
            help="true: the same seed gives the same run (op determinism, fixed input order); "
            "false: faster on GPU.",
        ),
    ] = "true",
    scaled_decode: Annotated[
        str,
        typer.Option(
            metavar="BOOL",
            help="true: decode a JPEG at least twice --image-size at 1/2, 1/4 or 1/8 scale "
            "before resizing (~30% less CPU at 512 -> 224 px, slightly different pixels); "
            "false: decode whole.",
        ),
    ] = "true",
    mixed_precision: Annotated[
        str,
        typer.Option(help=f"{' | '.join(MIXED_PRECISION)}: float16 compute; auto = on a GPU only."),
    ] = DEFAULTS.mixed_precision,
    jit_compile: Annotated[
        str, typer.Option(metavar="BOOL", help="true: compile the steps with XLA.")
    ] = "false",
    strategy: Annotated[
        str,
        typer.Option(
            help=f"{' | '.join(STRATEGIES)}: mirrored copies the model to every local GPU and "
            "splits each batch (global) between them; auto: mirrored with 2+ GPUs."
        ),
    ] = DEFAULTS.strategy,
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
    export_out: Annotated[
        str,
        typer.Option(
            help="Local folder for a SavedModel serving encoded image bytes; '' for none."
        ),
    ] = "",
    checkpoint_dir: Annotated[
        str,
        typer.Option(
            help="Local folder for per-epoch checkpoints: a killed run resumes from it. "
            "It must be new, empty or made by tfshards, and hold no other output; "
            "its checkpoint files are removed when the run finishes. '' for none."
        ),
    ] = "",
) -> None:
    """Train a classifier on the validated shards of --manifest and log its metrics.

    The shards are split into train and validation by whole files (seeded).
    Every epoch logs loss, accuracy, val_loss, val_accuracy, examples/s and
    input_bound_fraction (the share of step time spent waiting for data: near
    1, the input pipeline is the bottleneck; near 0, the model is) to dvclive.
    On a GPU, mixed precision is on by default and XLA is optional; the same
    code runs on CPU.

    Arguments after -- (``--units 64``) are passed to a package.module:function model.
    """
    config = TrainConfig(
        manifest=manifest,
        model=model,
        model_args=parse_model_args(ctx.args),
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        optimizer=optimizer,
        momentum=momentum,
        weight_decay=weight_decay,
        lr_schedule=lr_schedule,
        warmup_epochs=warmup_epochs,
        early_stopping=early_stopping,
        early_stopping_metric=early_stopping_metric,
        label_smoothing=label_smoothing,
        class_weight=class_weight,
        augment=tuple(a.strip() for a in augment.split(",") if a.strip() not in ("", "none")),
        image_dtype=image_dtype,
        image_size=image_size,
        scaled_decode=parse_bool(scaled_decode, "--scaled-decode"),
        val_fraction=val_fraction,
        seed=seed,
        split_seed=optional_int(split_seed, "--split-seed"),
        deterministic=parse_bool(deterministic, "--deterministic"),
        mixed_precision=mixed_precision,
        jit_compile=parse_bool(jit_compile, "--jit-compile"),
        strategy=strategy,
        metrics=metrics,
        live_dir=live_dir,
        model_out=model_out,
        split_out=split_out,
        export_out=export_out or None,
        checkpoint_dir=checkpoint_dir or None,
    )
    from tfshards.training.train import train

    result = train(config, log=lambda line: typer.echo(line, err=True))
    typer.echo(result.summary())
