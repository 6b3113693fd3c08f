"""``tfshards validate``: the ``validate`` stage, the pipeline's gate."""

from __future__ import annotations

from typing import Annotated

import typer

from tfshards.cli._common import (
    DaskAddress,
    Executor,
    SharedFs,
    ShowProgress,
    Workers,
    default_workers,
    one_line_errors,
)
from tfshards.validate import MAX_PROBLEMS, ValidateConfig, validate, write_metrics


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
    workers: Workers = default_workers(),
    executor: Executor = "auto",
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
    """
    config = ValidateConfig(
        manifest=manifest,
        decode_images=decode,
        workers=workers,
        executor=executor,
        dask_address=dask_address,
        shared_fs=shared_fs,
        max_problems=max_problems,
    )
    report = validate(config, progress=progress)
    write_metrics(report, metrics)
    if not report.ok:
        shown = report.problems[:max_problems]
        for problem in shown:
            typer.echo(str(problem), err=True)
        if report.problem_count > len(shown):
            typer.echo(f"... and {report.problem_count - len(shown)} more problems", err=True)
        report.raise_for_problems()
    typer.echo(report.summary())
