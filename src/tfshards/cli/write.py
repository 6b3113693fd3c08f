"""``tfshards write``: the ``write`` stage."""

from __future__ import annotations

import math
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
from tfshards.errors import ConfigError
from tfshards.writing import sharding
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write


def dashed(token: str) -> str:
    """An option spelled as a ``params.yaml`` key (``--num_shards``), as declared."""
    return token.replace("_", "-")


# The write stage passes its params section through DVC's dict unpacking, which
# spells each option as its key (`--group_by`); click normalizes option names with this.
CONTEXT = {"token_normalize_func": dashed}


@one_line_errors
def write_command(
    listing: Annotated[str, typer.Argument(help="Listing directory written by `tfshards list`.")],
    out: Annotated[
        str,
        typer.Option(help="Where version directories go: a local path or any fsspec URL."),
    ] = "data/shards",
    manifest: Annotated[
        str | None,
        typer.Option(help="Also save the manifest here (a local path; the DVC-tracked copy)."),
    ] = "data/manifest.json",
    name: Annotated[str, typer.Option(help="Shard file prefix: NAME-00003-of-00016.tfrecord.")] = (
        "data"
    ),
    num_shards: Annotated[
        int,
        typer.Option(help="Number of shards; 0 derives it from --target-shard-mb (>= 16)."),
    ] = 0,
    target_shard_mb: Annotated[
        float, typer.Option(help="Shard size aimed at when --num-shards is 0, in MiB.")
    ] = sharding.DEFAULT_TARGET_SHARD_BYTES / (1 << 20),
    seed: Annotated[int, typer.Option(help="Seed of the global record shuffle.")] = 0,
    group_by: Annotated[
        str,
        typer.Option(
            help="Keep each group's records in one shard: a regex over the path relative to "
            "the root; its first (...) group, else the whole match, names the group. "
            "Example: '^([^/]+/[^_]+)_' groups cat/s01_0.jpg with cat/s01_1.jpg. "
            "A path it does not match is an error. none: no groups."
        ),
    ] = "none",
    compression: Annotated[
        str, typer.Option(help="none | gzip | zlib. JPEG/PNG do not shrink; gzip is 10-30x slower.")
    ] = "none",
    image_feature: Annotated[
        str, typer.Option(help="Feature name of the raw file bytes.")
    ] = "image",
    transform: Annotated[
        str | None,
        typer.Option(help="package.module:function(path, data, label) -> dict of features."),
    ] = None,
    on_error: Annotated[
        str,
        typer.Option(help="fail: stop at the first bad file; skip: record it in the manifest."),
    ] = "fail",
    resize: Annotated[
        int,
        typer.Option(
            help="Store every image resized to RESIZE x RESIZE pixels (stretched, as the "
            "loader resizes), re-encoded once here instead of resized every epoch; "
            "0 stores the files as listed."
        ),
    ] = 0,
    resize_format: Annotated[
        str,
        typer.Option(
            help="With --resize: jpeg (quality 90) or raw (uint8 pixels in a BMP: 147 KB "
            "per 224 px RGB image, nothing to decode; 16x the bench's resized JPEGs)."
        ),
    ] = "jpeg",
    workers: Workers = default_workers(),
    executor: Executor = "auto",
    dask_address: DaskAddress = None,
    shared_fs: SharedFs = False,
    progress: ShowProgress = True,
) -> None:
    """Write the listed files into versioned TFRecord shards of tf.train.Example.

    Records are shuffled globally with SEED and cut into shards; the same
    listing and options give byte-identical shards and manifest whatever the
    number of workers. With --group-by, groups are shuffled and packed whole
    into shards, then each shard's records are shuffled. Shards go to
    OUT/<fingerprint>/ and the manifest, written last, commits the set. A
    re-run after a crash keeps the finished shards. Storage credentials come
    from the environment (e.g. AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL), never
    from options.
    """
    if not math.isfinite(target_shard_mb) or target_shard_mb <= 0:
        raise ConfigError(
            f"--target-shard-mb: expected a number of MiB above 0, got {target_shard_mb}"
        )
    config = WriteConfig(
        out=out,
        name=name,
        num_shards=num_shards or None,
        target_shard_bytes=int(target_shard_mb * (1 << 20)),
        seed=seed,
        group_by=group_by,
        compression=compression,
        image_feature=image_feature,
        transform=transform,
        on_error=on_error,  # type: ignore[arg-type]  # checked by WriteConfig
        resize=resize or None,
        resize_format=resize_format,
        workers=workers,
        executor=executor,
        dask_address=dask_address,
        shared_fs=shared_fs,
        manifest_copy=manifest,
    )
    result = write(config, listing, progress=progress)
    m = result.manifest
    typer.echo(
        f"wrote {m.records} records in {len(m.shards)} shards ({m.bytes / 1e6:.1f} MB, "
        f"{len(m.rejected)} rejected, {result.reused} shards reused) to {m.root} "
        f"in {result.seconds:.1f}s"
    )
