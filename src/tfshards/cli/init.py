"""``tfshards init``: write the tfshards stages into the current DVC repository."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tfshards import storage
from tfshards._version import __version__
from tfshards.cli._common import one_line_errors
from tfshards.project import pipeline

DEFAULTS = pipeline.PipelineSpec()


RootOption = Annotated[
    str | None,
    typer.Option(
        help="Raw files in ImageFolder layout (ROOT/<label>/<file>): a path in the repo "
        f"or any fsspec URL. (default: {DEFAULTS.root})",
        show_default=False,
    ),
]
ShardsOption = Annotated[
    str | None,
    typer.Option(
        help="Where shard versions go. A URL (s3://bucket/shards, gs://...) gives the "
        "remote-first pipeline: DVC tracks only the manifest and the metrics. "
        f"(default: {DEFAULTS.shards})",
        show_default=False,
    ),
]
NameOption = Annotated[
    str | None,
    typer.Option(
        help=f"Shard file prefix: NAME-00003-of-00016.tfrecord. (default: {DEFAULTS.name})",
        show_default=False,
    ),
]
ImageSizeOption = Annotated[
    int | None,
    typer.Option(
        help="Training resizes images to SIZE x SIZE pixels (the shards keep the original "
        f"files). (default: {DEFAULTS.image_size})",
        show_default=False,
    ),
]
ExtensionsOption = Annotated[
    str | None,
    typer.Option(
        help=f"Comma-separated suffixes to list. (default: {DEFAULTS.extensions})",
        show_default=False,
    ),
]
ForceOption = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace tfshards stages that differ from what init writes (e.g. after an "
        "upgrade), and params that differ from the options given here; also remove params "
        "an earlier release wrote that no command reads now, and update tfshards' comments "
        "in params.yaml.",
    ),
]


@one_line_errors
def init_command(
    root: RootOption = None,
    shards: ShardsOption = None,
    name: NameOption = None,
    image_size: ImageSizeOption = None,
    extensions: ExtensionsOption = None,
    force: ForceOption = False,
) -> None:
    """Add the tfshards pipeline (list -> write -> validate -> train) to this repository.

    Writes or merges the stages into ./dvc.yaml and their sections (list,
    write, validate, train) into ./params.yaml, then `dvc repro` runs them. Other
    stages, params and comments are kept; an option left out keeps the value
    params.yaml already has. Re-running without options changes nothing; an
    option that changes an existing value needs --force. Each command is
    pinned to this tfshards version, so a later `tfshards init --force` after
    an upgrade makes DVC re-run the stages.

    Needs `git init` and `dvc init` first. Edit params.yaml to tune; never put
    credentials there (dvc.lock copies it): storage credentials and endpoints
    come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_ENDPOINT_URL for S3-compatible stores).
    """
    given: dict[str, Any] = {
        "root": root,
        "shards": shards,
        "name": name,
        "image_size": image_size,
        "extensions": extensions,
    }
    explicit = {k: v for k, v in given.items() if v is not None}
    # The YAML round trip loads only when init runs.
    from tfshards.project import ignores, pipeline, rawdata, scaffold

    result = scaffold.init(Path.cwd(), explicit, force=force, version=__version__)
    variant = "remote-first: DVC tracks the manifest" if result.spec.remote else "local"
    outs = [f"{pipeline.LISTING}/", pipeline.MANIFEST, f"{result.spec.shards.rstrip('/')}/"]
    if ignores.update(Path.cwd(), result.spec.root, outs):
        typer.echo(".gitignore: raw data, the stages' outputs and checkpoints/ kept out of git")
    fs, raw = storage.open_url(result.spec.root)
    missing = storage.is_local(fs) and not fs.exists(raw)  # a remote root is not probed here
    if missing:
        typer.echo(
            f"note: {result.spec.root} does not exist yet: put the images there as "
            f"{result.spec.root}/<label>/<file>, then `dvc add {result.spec.root}` "
            "before `dvc repro`"
        )
    elif storage.is_local(fs) and rawdata.track(Path.cwd(), result.spec.root):
        typer.echo(
            f"dvc add {result.spec.root}: raw files tracked by DVC "
            f"(commit {result.spec.root}.dvc; `dvc push` shares them)"
        )
    for section, keys in result.params.shared.items():
        typer.echo(
            f"warning: params.yaml: section {section!r} also holds keys tfshards does not use "
            f"({', '.join(keys[:3])}): tfshards' {section} stage now reads its params there, "
            "yours included, and runs again when any of them changes; rename your section "
            "to keep them apart",
            err=True,
        )
    typer.echo(f"dvc.yaml: {result.stages.summary('stages') or 'unchanged'}")
    typer.echo(f"params.yaml: {result.params.summary('params') or 'unchanged'}")
    if "write.old_versions" in result.params.added and not result.spec.remote:
        typer.echo(
            f"note: write.old_versions: remove: from the next write on, the other versions "
            f"under {result.spec.shards} that DVC's cache holds are deleted (DVC keeps them: "
            "`git checkout` + `dvc checkout` brings one back); set it to keep to keep them "
            "there"
        )
    after = "dvc repro"
    if missing:
        after = f"put the images in, dvc add {result.spec.root}, then dvc repro"
    typer.echo(
        f"raw files: {result.spec.root}; shards: {result.spec.shards} ({variant}). Next: {after}"
    )
