"""``tfshards prune``: list, and with ``--delete`` remove, unreferenced version directories."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from tfshards.cli._common import one_line_errors
from tfshards.project.prune import DEFAULT_MIN_AGE_S, PruneConfig, prune


@one_line_errors
def prune_command(
    manifest: Annotated[
        str, typer.Option(help="The current manifest; the version it references is kept.")
    ] = "data/manifest.json",
    out: Annotated[
        str | None,
        typer.Option(
            help="Shard location holding the version directories (path or fsspec URL). "
            "Default: the folder of the current manifest's version."
        ),
    ] = None,
    keep_commits: Annotated[
        int,
        typer.Option(
            help="Also keep the versions the manifest referenced in the last N git commits "
            "that changed it or dvc.lock (read through DVC)."
        ),
    ] = 0,
    keep_refs: Annotated[
        bool,
        typer.Option(
            "--keep-refs/--no-keep-refs",
            help="Also keep the versions the manifest references at the tip of each git "
            "branch (local or remote), tag and DVC experiment (`dvc exp run`; read through "
            "DVC). On by default: on an object store a deleted version is gone for good.",
        ),
    ] = True,
    min_age_minutes: Annotated[
        float,
        typer.Option(help="Keep any version with a file modified less than this long ago."),
    ] = DEFAULT_MIN_AGE_S / 60,
    delete: Annotated[
        bool, typer.Option("--delete", help="Delete them (default: only list what would go).")
    ] = False,
    interrupted: Annotated[
        bool,
        typer.Option(
            "--interrupted",
            help="Also take versions without manifest.json whose write is given up: no "
            "writer holds a lease on it and nothing in it changed within "
            "--min-age-minutes (a write that failed on a file since fixed or removed, whose "
            "listing will never name that version again).",
        ),
    ] = False,
) -> None:
    """List the version directories no kept manifest references; delete them with --delete.

    One line per version (keep / would delete / deleted, with its size and
    why), then a summary. Never touches a version without manifest.json (unless
    --interrupted), with a writer's temp file or lease, or modified within
    --min-age-minutes: it may be being written, nor one holding a file tfshards
    did not write. In a DVC
    project with local shards, run `dvc commit -f` after deleting so dvc.lock
    records the smaller shard folder; on S3 a deleted version is gone for good.
    """
    if not min_age_minutes >= 0:  # NaN too: it compares false
        raise typer.BadParameter(
            f"expected minutes >= 0, got {min_age_minutes}", param_hint="'--min-age-minutes'"
        )
    config = PruneConfig(
        manifest=manifest,
        out=out,
        keep_commits=keep_commits,
        keep_refs=keep_refs,
        min_age_s=min_age_minutes * 60,
        delete=delete,
        interrupted=interrupted,
    )
    report = prune(config)
    for version in report.versions:
        typer.echo(str(version))
    typer.echo(report.summary())
    deleted = any(v.action == "deleted" for v in report.versions)
    if deleted and "://" not in report.out and os.path.isfile("dvc.lock"):  # a local DVC out
        typer.echo("next: `dvc commit -f` records the smaller shard folder in dvc.lock")
