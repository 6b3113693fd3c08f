"""``tfshards write``: the ``write`` stage; its options are ``tfshards.writing.config.OPTIONS``."""

from __future__ import annotations

import os
import posixpath
import tempfile
from typing import Any

import typer

from tfshards.cli._common import one_line_errors
from tfshards.errors import CHANGED_SINCE_LISTING, ConfigError
from tfshards.project import stageoptions
from tfshards.shardset.buckets import DEFAULT_BUCKETS
from tfshards.writing.config import OPTIONS, WriteConfig


def dashed(token: str) -> str:
    """An option spelled as a ``params.yaml`` key (``--num_shards``), as declared."""
    return token.replace("_", "-")


# The write stage passes its params section through DVC's dict unpacking, which
# spells each option as its key (`--group_by`); click normalizes option names with this.
CONTEXT = {"token_normalize_func": dashed}


OLD_VERSIONS = ("keep", "remove")


def _write(values: dict[str, Any]) -> None:
    from tfshards import storage
    from tfshards.shardset.layout import MANIFEST_NAME
    from tfshards.writing.writer import write

    config = stageoptions.config(WriteConfig, OPTIONS, values)
    if values["old_versions"] not in OLD_VERSIONS:
        raise ConfigError(
            f"old_versions: expected one of {OLD_VERSIONS}, got {values['old_versions']!r}",
            option="old_versions",
            valid=OLD_VERSIONS,
        )
    if values["old_versions"] == "remove" and not storage.is_local(
        storage.open_url(config.out, **config.out_options)[0]
    ):
        raise ConfigError(
            f"old_versions remove: {config.out} is not local disk, so nothing would keep the "
            "versions it deletes (DVC's cache keeps those of a local shard folder only): use "
            "keep, and `tfshards prune` to delete versions you no longer need",
            option="old_versions",
        )
    committed = not _warn_unlocked(config)
    if values["near_duplicates"]:
        typer.echo(
            "warning: write.near_duplicates is no longer write's: validate hashes the images. "
            "Run `tfshards init --force` (it adds validate.near_duplicates and removes "
            "write.near_duplicates), then set validate.near_duplicates: true in params.yaml",
            err=True,
        )
    result = write(config, values["listing"], progress=values["progress"])
    m = result.manifest
    typer.echo(
        f"wrote {m.records} records in {len(m.shards)} shards ({m.bytes / 1e6:.1f} MB, "
        f"{len(m.rejected)} rejected, {_reused(result)}) to {m.root} "
        f"in {result.seconds:.1f}s"
    )
    changed = [r.path for r in m.rejected if r.reason.startswith(CHANGED_SINCE_LISTING)]
    if changed:  # the listing is stale: a write of it leaves them out every time
        files = f"{len(changed)} files" if len(changed) > 1 else "1 file"
        typer.echo(
            f"warning: {files} changed since the listing (first: {changed[0]}) and left "
            "out; run `tfshards list` again",
            err=True,
        )
    if config.exif != "ignore" and result.rotated:
        done = "stored upright" if config.exif == "apply" else "stored as they are (exif: warn)"
        typer.echo(f"{result.rotated} files with an EXIF orientation of 2-8 {done}")
    _say_lineage(result, config, values["old_versions"], committed)
    if values["old_versions"] == "remove":
        _remove_old_versions(config, storage.join(m.directory, MANIFEST_NAME))


def _reused(result: Any) -> str:
    """``"16 shards reused"``, and how many an interrupted write had finished."""
    kept = result.reused - result.resumed
    return f"{kept} shards reused" + (f", {result.resumed} resumed" if result.resumed else "")


def _say_lineage(result: Any, config: WriteConfig, old_versions: str, committed: bool) -> None:
    """The lines on the version this one came from: kept, grown from it, or written anew."""
    from tfshards.shardset import diff

    m = result.manifest
    if result.unchanged:
        typer.echo(f"nothing changed since version {m.fingerprint}: kept it as it is")
        kept = m.params.get("num_shards")
        if config.num_shards and kept != config.num_shards:
            typer.echo(
                f"num_shards: the version keeps its {kept} shards; {config.num_shards} sizes "
                "the shards new records go into (--previous none writes the set anew)"
            )
    elif m.base:
        c = m.changes
        records = "record" if c.get("added", 0) == 1 else "records"
        hint = _diff_hint(config.out, result.base_directory, m.fingerprint, old_versions, committed)
        typer.echo(
            f"grew from version {m.base}: {c.get('added', 0)} {records} added, "
            f"{c.get('removed', 0)} removed, {c.get('changed', 0)} changed, "
            f"{c.get('relabeled', 0)} relabeled, {_count(c.get('labels_added', 0), 'label')} added"
            f"{_label_map_changes(c)} "
            f"({hint})"
        )
        line = diff.moved_files_line(m)
        if line:
            typer.echo(f"warning: {line}", err=True)
    elif result.damaged:  # only where the plan names that very version again
        typer.echo(f"{result.damaged}: wrote it again")
    elif result.fresh:
        typer.echo(f"not grown from the previous version: {result.fresh}; label ids kept")
    if result.resplit:
        # diff compares buckets only between versions with as many of them
        counted = (
            "`tfshards diff OLD NEW` counts those moved to another bucket"
            if "buckets " not in result.resplit
            else "with another number of buckets every record may have moved; `tfshards diff "
            "OLD NEW` cannot compare sides, and lists the files added and removed"
        )
        typer.echo(
            f"warning: the split is keyed anew {result.resplit}: records may have changed "
            "sides, so a model trained on the old version would be scored partly on its own "
            f"training records ({counted})",
            err=True,
        )
    kept = m.params.get("buckets")
    asked = config.buckets
    grown = m.base or result.unchanged
    if grown and isinstance(kept, int) and kept < asked and asked != DEFAULT_BUCKETS:
        typer.echo(
            f"buckets: kept the lineage's {kept} split buckets, not {asked}: more would move "
            "records across the split (--previous none starts a lineage with them)"
        )


def _count(n: int, noun: str) -> str:
    """``"1 label"``, ``"2 labels"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _label_map_changes(changes: Any) -> str:
    """``", 1 removed, 2 ids changed"`` where the label map lost labels or moved ids
    (``--relabel``); "" otherwise."""
    removed, moved = changes.get("labels_removed", 0), changes.get("ids_changed", 0)
    return (f", {removed} removed" if removed else "") + (f", {moved} ids changed" if moved else "")


def _warn_unlocked(config: WriteConfig) -> bool:
    """Say so when the manifest this write grows from is not the one ``dvc.lock`` records
    (or HEAD's does); whether it said so."""
    copy = config.manifest_copy
    if config.previous != "auto" or not copy or "://" in copy or not os.path.isfile("dvc.lock"):
        return False
    from tfshards.project import dvclock

    line = dvclock.unlocked(copy)
    if line:
        typer.echo(f"warning: {line}", err=True)
    return bool(line)


def _diff_hint(out: str, base: str, new: str, old_versions: str, committed: bool) -> str:
    """The command that lists a grown version's changes: the old version is where it
    is (``base``, its folder), unless this write removes it from ``out``, then in DVC's
    cache, at HEAD when ``committed`` (else at a commit that holds it, if any)."""
    out = out.rstrip("/")
    old = posixpath.basename(base.rstrip("/"))
    if old_versions == "remove":
        got = os.path.join(tempfile.gettempdir(), f"tfshards-{old}")  # outside the repository
        rev = "HEAD" if committed else "REV"
        where = "" if committed else ", REV a commit that holds it (an uncommitted one is gone)"
        return (
            f"the old version is removed from {out} next; `dvc get . {out} --rev {rev} -o "
            f"{got}`, then `tfshards diff {got}/{old} {out}/{new}` lists them{where}"
        )
    there = posixpath.dirname(base.rstrip("/"))
    same = there == out or ("://" not in out and os.path.abspath(there) == os.path.abspath(out))
    return f"`tfshards diff {f'{out}/{old}' if same else base.rstrip('/')} {out}/{new}` lists them"


def _remove_old_versions(config: WriteConfig, manifest: str) -> None:
    """Delete the other finished, idle versions under ``config.out``, and the folders of
    writes given up (no manifest, no live lease: a write that failed on a file since
    changed, which DVC would otherwise record in the out), and say so."""
    from tfshards.project.prune import PruneConfig, prune

    pruned = PruneConfig(  # local disk only: DVC's cache holds every version it ran
        manifest,
        config.out,
        keep_refs=False,
        min_age_s=0,
        delete=True,
        interrupted=True,
        storage_options=config.out_options,
        cached_only=True,
    )
    report = prune(pruned)
    gone = [v for v in report.versions if v.action == "deleted"]
    if gone:
        names = ", ".join(v.name for v in gone)
        versions = "version" if len(gone) == 1 else "versions"
        typer.echo(f"old_versions remove: deleted {len(gone)} other {versions} ({names})")
    current = posixpath.basename(posixpath.dirname(manifest))
    for v in report.versions:
        if v.action == "keep" and v.name != current:
            typer.echo(f"warning: old_versions remove: kept {v.name}: {v.reason}", err=True)


write_command = one_line_errors(
    stageoptions.command(
        OPTIONS,
        _write,
        name="write_command",
        section="write",
        unpacked=True,
        doc="""Write the listed files into versioned TFRecord shards of tf.train.Example.

    Each record hashes into one of BUCKETS split buckets by its path (or its
    --group-by group); each bucket's records are shuffled with SEED and cut
    into shards, so every shard holds one bucket and validation takes whole
    buckets. The same listing and options give byte-identical shards and
    manifest whatever the number of workers. Shards go to OUT/<fingerprint>/
    and the manifest, written last, commits the set. A re-run after a crash
    keeps the finished shards.

    With a previous version (--previous; by default the manifest at
    --manifest), the new version keeps its label ids and reuses each of its
    shards whose records are all listed again unchanged; added and changed
    files, and the other records of a shard that lost one, go into new shards.
    Storage credentials come from the environment (e.g. AWS_ACCESS_KEY_ID,
    AWS_ENDPOINT_URL), never from options.
    """,
    )
)
