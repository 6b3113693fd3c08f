"""``tfshards diff``: what changed between two versions, from their manifests and member lists."""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from tfshards import storage
from tfshards.cli._common import one_line_errors
from tfshards.errors import InputError
from tfshards.shardset import layout
from tfshards.shardset.layout import MANIFEST_NAME

if TYPE_CHECKING:
    from tfshards.shardset.diff import Changes

VERSION_NAME = re.compile(r"[0-9a-f]{16}")  # a version directory's name: its fingerprint
_FORMS = (
    "A manifest (path or fsspec URL), a version directory (its manifest.json), or a "
    "version name (16 hex digits) under --out."
)


def manifest_url(spec: str, out: str) -> str:
    """The manifest ``spec`` names: itself, ``<spec>/manifest.json``, or ``<out>/<spec>/...``.

    A version name that is also a local path is that path.
    """
    if VERSION_NAME.fullmatch(spec) and not os.path.exists(spec):
        return storage.join(out, spec, MANIFEST_NAME)
    fs, path = storage.open_url(spec)
    return storage.join(spec, MANIFEST_NAME) if fs.isdir(path) else spec


def _named(spec: str, out: str) -> str:
    """:func:`manifest_url`; a version name not under ``out`` is one line saying where
    such a version is (``old_versions: remove`` deletes the old one at each write)."""
    url = manifest_url(spec, out)
    if VERSION_NAME.fullmatch(spec) and not os.path.exists(spec):
        fs, path = storage.open_url(url)
        if not fs.exists(path):
            raise InputError(
                f"{url}: no version {spec} under {out}; a version removed from it "
                f"(write.old_versions: remove) comes back with `dvc get . {out} --rev REV -o "
                f"DIR` (REV a commit that holds it), then `tfshards diff DIR/{spec} ...`",
                path=url,
            )
    return url


def path_lines(what: str, paths: Sequence[str], limit: int) -> list[str]:
    """``what (n):`` and the first ``limit`` paths, indented; nothing when there are none."""
    if not paths:
        return []
    lines = [f"{what} ({len(paths)}):", *(f"  {shown(p)}" for p in paths[:limit])]
    if len(paths) > limit:
        lines.append(f"  ... and {len(paths) - limit} more")
    return lines


def shown(path: str) -> str:
    """``path`` as is, or JSON-quoted with escapes when printing it plainly would mislead:
    a control character (a newline would split it in two) or a name not in NFC (``café``
    spelt with a combining accent looks like the precomposed one)."""
    if path.isprintable() and unicodedata.is_normalized("NFC", path):
        return path
    return json.dumps(path)


def summary(changes: Changes, limit: int | None) -> list[str]:
    """The summary lines, then (``limit`` not None) the first paths of each kind."""
    lines = changes.lines()
    if limit is not None:
        for what, paths in (
            ("added", changes.added_paths),
            ("removed", changes.removed_paths),
            ("changed", changes.changed_paths),
            ("relabeled", changes.relabeled_paths),
            ("moved", [f"{shown(a)} -> {shown(b)}" for a, b in changes.moved_paths]),
        ):
            lines += path_lines(what, paths, limit)
    return lines


@one_line_errors
def diff_command(
    old: Annotated[str, typer.Argument(help="The old version. " + _FORMS, show_default=False)],
    new: Annotated[str, typer.Argument(help="The new version, in any form OLD takes.")],
    out: Annotated[
        str,
        typer.Option(
            help="Shard location (path or fsspec URL) a version name OLD or NEW is looked up in."
        ),
    ] = "data/shards",
    metrics: Annotated[
        str | None,
        typer.Option(
            help='Also write the counts as JSON here, under a "diff" key: a DVC metric '
            "(`dvc metrics diff` compares them across commits)."
        ),
    ] = None,
    paths: Annotated[
        bool,
        typer.Option(
            "--paths/--no-paths", help="List the added, removed, changed and relabeled paths."
        ),
    ] = True,
    limit: Annotated[
        int, typer.Option(min=0, help="List at most this many paths of each kind.")
    ] = 20,
) -> None:
    """Compare two versions record by record: added, removed, changed, relabeled.

    OLD and NEW are each a manifest (path or fsspec URL), a version directory
    (its manifest.json is read), or a version name (16 hex digits, the
    directory's name) looked up under --out. Records are matched by their listed
    path; a changed record has another content token, a relabeled one the same
    token under another label name. Also printed: records per label, labels
    added, removed or given another id, and records whose split bucket moved.
    Reads the manifests and each shard's member list (records/<shard>.jsonl),
    never a shard.
    """
    from tfshards import jsonfile
    from tfshards.shardset.diff import compare, load_members
    from tfshards.shardset.manifest import load

    old_manifest, new_manifest = (load(_named(s, out)) for s in (old, new))
    changes = compare(
        old_manifest, new_manifest, load_members(old_manifest), load_members(new_manifest)
    )
    if metrics is not None:  # first: whatever reads the lines may stop early (``| head``)
        layout.refuse_in_version(metrics, "--metrics")
        jsonfile.save({"diff": changes.to_metrics()}, metrics)
    for side, manifest in (("old", old_manifest), ("new", new_manifest)):
        typer.echo(
            f"{side}: {manifest.directory} ({manifest.records} records, "
            f"{len(manifest.shards)} shards)"
        )
    for line in summary(changes, limit if paths else None):
        typer.echo(line)
