"""``tfshards list``: the listing stage (also run by ``stages/list_files.py``)."""

from __future__ import annotations

from typing import Annotated

import typer

from tfshards.cli._common import one_line_errors
from tfshards.listing.hashcache import OFF, default_path
from tfshards.listing.treefilter import DEFAULT_EXTENSIONS

RootArgument = Annotated[
    str,
    typer.Argument(
        help="Folder or fsspec URL (s3://bucket/raw, gs://..., memory://...) to list.",
        show_default=False,
    ),
]
OutOption = Annotated[
    str,
    typer.Option(
        "--out",
        help="Folder to write files.jsonl and meta.json into (local path or URL).",
        show_default=False,
    ),
]
IndexOption = Annotated[
    str | None,
    typer.Option(
        "--index",
        help="CSV (.csv, columns path,label) or JSON lines (.jsonl/.json, keys path, label) "
        "with paths relative to ROOT. Default: labels are ROOT's first-level folders.",
    ),
]
ExtensionsOption = Annotated[
    str,
    typer.Option(
        "--extensions",
        help="Comma-separated file suffixes to keep, case-insensitive; '*' keeps every file.",
    ),
]
GlobOption = Annotated[
    str | None,
    typer.Option(
        "--glob",
        help="fnmatch pattern the path relative to ROOT must match ('*' also matches '/'), "
        "e.g. 'train/*'.",
    ),
]
HashCacheOption = Annotated[
    str | None,
    typer.Option(
        "--hash-cache",
        help="SQLite file remembering each local file's SHA-256 by its stat, so an "
        "unchanged file is not read again; 'none' reads every file. Default: "
        "$TFSHARDS_HASH_CACHE, else ~/.cache/tfshards/listing-hashes.sqlite. "
        "A file there that tfshards did not make is refused and left as it is.",
        show_default=False,
    ),
]
MetricsOption = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        help="Also write the counts (files per label, skipped files per reason) "
        "as JSON here: a DVC metric.",
    ),
]


@one_line_errors
def list_files_command(
    root: RootArgument,
    out: OutOption,
    index: IndexOption = None,
    extensions: ExtensionsOption = ",".join(DEFAULT_EXTENSIONS),
    glob: GlobOption = None,
    hash_cache: HashCacheOption = None,
    metrics: MetricsOption = None,
) -> None:
    """List ROOT's files and labels into OUT/files.jsonl and OUT/meta.json.

    Labels are the first folder level under ROOT (ImageFolder layout):

    \b
        ROOT/cat/0001.jpg        -> label "cat"
        ROOT/cat/more/0002.jpg   -> label "cat"
        ROOT/dog/0003.png        -> label "dog"
        ROOT/notes.jpg           -> skipped (no-label)
        ROOT/.cache/, ROOT/.x.jpg -> skipped (hidden)

    With --index, labels come from the index file instead. Every skipped file is
    counted by reason (hidden, extension, glob, no-label, not-a-file) in
    meta.json and in the summary line. files.jsonl holds one JSON object per
    file, sorted by path: label, label_index, path, size and a change token.
    Credentials for URLs come from the environment or fsspec config.

    A local file's SHA-256 is remembered with its stat (device, inode, size,
    mtime, ctime) in --hash-cache: listing an unchanged tree again reads no file.
    """
    from tfshards import jsonfile
    from tfshards.listing.listing import format_skipped
    from tfshards.listing.treelisting import list_to

    if hash_cache is None:
        hash_cache = default_path()
    elif hash_cache.strip().lower() == OFF:
        hash_cache = None
    summary = list_to(
        root, out, index=index, extensions=extensions.split(","), glob=glob, hash_cache=hash_cache
    )
    if metrics is not None:
        doc = {
            "files": summary.files,
            "files_per_label": summary.files_per_label,
            "labels": len(summary.labels),
            "skipped": summary.skipped,
        }
        jsonfile.save(doc, metrics)
    total = sum(summary.skipped.values())
    detail = f" = {format_skipped(summary.skipped)}" if total else ""
    typer.echo(
        f"listed {summary.files} files in {len(summary.labels)} labels "
        f"(skipped: {total}{detail}) -> {out}"
    )
