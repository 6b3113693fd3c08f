"""``tfshards validate``: the ``validate`` stage, the pipeline's gate."""

from __future__ import annotations

from typing import Annotated

import click
import typer

from tfshards.cli._common import (
    DaskAddress,
    SharedFs,
    ShowProgress,
    ValidateExecutor,
    Workers,
    default_workers,
    one_line_errors,
    optional_int,
)
from tfshards.validation.shardcheck import MAX_PROBLEMS
from tfshards.validation.validate import ValidateConfig, validate, write_balance, write_metrics


@one_line_errors
def validate_command(
    manifest: Annotated[
        str, typer.Argument(help="manifest.json written by `tfshards write` (path or fsspec URL).")
    ],
    metrics: Annotated[
        str, typer.Option(help="Where to write the metrics JSON (DVC metrics; no timings).")
    ] = "results/validate/metrics.json",
    decode: Annotated[
        bool, typer.Option(help="Also decode every image with Pillow (slow: ~0.1-1.5 ms each).")
    ] = False,
    max_problems: Annotated[
        int, typer.Option(help="Problems printed (all are counted, in the metrics too).")
    ] = MAX_PROBLEMS,
    val_fraction: Annotated[
        float,
        typer.Option(
            help="The training split's val_fraction (0: no split): records per label on each "
            "side, and duplicates across it, are reported."
        ),
    ] = 0.0,
    split_seed: Annotated[
        str,
        typer.Option(metavar="INT|none", help="The training split's seed; none: --seed."),
    ] = "none",
    seed: Annotated[
        int, typer.Option(help="The training seed, the split's when --split-seed is none.")
    ] = 0,
    fail_on_leakage: Annotated[
        str,
        typer.Option(
            help="true: a payload held by both a training and a validation record is a problem."
        ),
    ] = "false",
    fail_on_label_conflict: Annotated[
        str,
        typer.Option(
            help="true: a payload whose records carry different labels (the same image "
            "labelled twice) is a problem; false only counts them in the metrics."
        ),
    ] = "true",
    balance: Annotated[
        str | None,
        typer.Option(
            help="Folder for train.json and val.json, records per label of each side "
            "(a DVC bar plot)."
        ),
    ] = None,
    workers: Workers = default_workers(),
    executor: ValidateExecutor = "auto",
    dask_address: DaskAddress = None,
    shared_fs: SharedFs = False,
    progress: ShowProgress = True,
) -> None:
    """Check a shard set against its manifest; exit 1 on any problem.

    For every listed shard: it exists, its size and sha256 match, every
    record's length and data CRCs hold, every record is a tf.train.Example
    that conforms to the schema, its stored sha256 matches the image bytes
    (unless a transform replaced them), its label is in range, and the
    record counts match. Files in the version directory that the manifest
    does not list are problems too. Each problem is one stderr line; the
    metrics are written either way.

    Records with byte-identical payloads (the same stored sha256) are counted
    in the metrics, within the set and across the training split that
    --val-fraction and --split-seed give, and the first pairs printed; with
    --fail-on-leakage true, those across the split are problems. A payload
    whose records carry different labels is a label conflict, counted apart
    and, unless --fail-on-label-conflict false, a problem. A label missing
    from validation, or whose share there is off its share of training by more
    than 5 percentage points and sampling noise, gets a warning line.
    """
    leakage_fails = _flag(fail_on_leakage, "--fail-on-leakage")
    conflict_fails = _flag(fail_on_label_conflict, "--fail-on-label-conflict")
    config = ValidateConfig(
        manifest=manifest,
        decode_images=decode,
        workers=workers,
        executor=executor,
        dask_address=dask_address,
        shared_fs=shared_fs,
        max_problems=max_problems,
        val_fraction=val_fraction,
        split_seed=seed if (picked := optional_int(split_seed, "--split-seed")) is None else picked,
        fail_on_leakage=leakage_fails,
        fail_on_label_conflict=conflict_fails,
    )
    report = validate(config, progress=progress)
    write_metrics(report, metrics)
    if balance is not None:
        write_balance(report, balance)
    dups = report.duplicates
    if dups.records:
        typer.echo(
            f"warning: {dups.records} records repeat another's payload ({dups.groups} payloads, "
            f"{dups.across_splits} across the split, {dups.label_conflicts} under two labels)",
            err=True,
        )
        for dup in dups.examples:
            fails = (config.fail_on_label_conflict and dup.conflict is not None) or (
                config.fail_on_leakage and dup.across_splits
            )
            if not fails:  # a problem is printed below
                typer.echo(f"warning: {dup}", err=True)
    for line in report.warnings:
        typer.echo(f"warning: {line}", err=True)
    if not report.ok:
        shown = report.problems[:max_problems]
        for problem in shown:
            typer.echo(str(problem), err=True)
        if report.problem_count > len(shown):
            typer.echo(f"... and {report.problem_count - len(shown)} more problems", err=True)
        report.raise_for_problems()
    typer.echo(report.summary())


def _flag(value: str, option: str) -> bool:
    """A ``true``/``false`` option as DVC renders a params boolean."""
    try:
        return bool(click.BOOL.convert(value, None, None))
    except click.BadParameter:
        raise typer.BadParameter(
            f"expected true or false, got {value!r}", param_hint=option
        ) from None
