"""``tfshards list``: the listing stage; its options are ``listoptions.OPTIONS``."""

from __future__ import annotations

from typing import Any

import typer

from tfshards.cli._common import one_line_errors
from tfshards.listing.hashcache import OFF, default_path
from tfshards.listing.listoptions import OPTIONS
from tfshards.project import stageoptions


def _list(values: dict[str, Any]) -> None:
    from tfshards import jsonfile, storage
    from tfshards.format.columns import parse_columns
    from tfshards.listing.listing import format_skipped
    from tfshards.listing.meta import FILES_NAME
    from tfshards.listing.treelisting import list_to
    from tfshards.shardset import layout

    hash_cache = values["hash_cache"]
    if hash_cache is None:
        hash_cache = default_path()
    elif hash_cache.strip().lower() == OFF:
        hash_cache = None
    out = values["out"]
    layout.refuse_in_version(storage.join(out, FILES_NAME), "--out")
    if values["metrics"] is not None:
        layout.refuse_in_version(values["metrics"], "--metrics")
    summary = list_to(
        values["root"],
        out,
        index=values["index"],
        extensions=values["extensions"].split(","),
        glob=values["glob"],
        hash_cache=hash_cache,
        columns=parse_columns(values["columns"]),
    )
    if values["metrics"] is not None:
        # Per label and per reason: the listing's meta.json; the metrics stay few.
        doc = {
            "files": summary.files,
            "labels": len(summary.labels),
            "skipped": sum(summary.skipped.values()),
        }
        jsonfile.save_metrics(doc, values["metrics"])
    total = sum(summary.skipped.values())
    detail = f" = {format_skipped(summary.skipped)}" if total else ""
    typer.echo(
        f"listed {summary.files} files in {len(summary.labels)} labels "
        f"(skipped: {total}{detail}) -> {out}"
    )


list_files_command = one_line_errors(
    stageoptions.command(
        OPTIONS,
        _list,
        name="list_files_command",
        section="list",
        doc="""List ROOT's files and labels into OUT/files.jsonl and OUT/meta.json.

    Labels are the first folder level under ROOT (ImageFolder layout):

    \b
        ROOT/cat/0001.jpg        -> label "cat"
        ROOT/cat/more/0002.jpg   -> label "cat"
        ROOT/dog/0003.png        -> label "dog"
        ROOT/notes.jpg           -> skipped (no-label)
        ROOT/.cache/, ROOT/.x.jpg -> skipped (hidden)

    With --index, labels come from the index file instead, and --columns keeps
    its extra columns with each file (written as features of each record). Every skipped file is
    counted by reason (hidden, extension, glob, no-label, not-a-file) in
    meta.json and in the summary line. files.jsonl holds one JSON object per
    file, sorted by path: label, label_index, path, size and a change token.
    Credentials for URLs come from the environment or fsspec config.

    A local file's SHA-256 is remembered with its stat (device, inode, size,
    mtime, ctime) in --hash-cache: listing an unchanged tree again reads no file.
    """,
    )
)
