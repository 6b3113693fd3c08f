"""``tfshards validate``: the ``validate`` stage, the pipeline's gate.

Its options are :data:`tfshards.validation.config.OPTIONS`.
"""

from __future__ import annotations

from typing import Any

import typer

from tfshards.cli._common import one_line_errors
from tfshards.errors import one_line
from tfshards.project import stageoptions
from tfshards.validation.config import OPTIONS, ValidateConfig

_DAMAGE = ("sha256 mismatch", "CRC mismatch")  # a shard's bytes, not its records' content


def _validate(values: dict[str, Any]) -> None:
    from tfshards.validation.validate import validate, write_outputs

    split_seed = values["split_seed"]
    config = stageoptions.config(
        ValidateConfig,
        OPTIONS,
        values,
        split_seed=values["seed"] if split_seed is None else split_seed,
    )
    report = validate(config, progress=values["progress"])
    write_outputs(
        report,
        metrics=values["metrics"],
        balance=values["balance"],
        image_metrics=values["image_metrics"],
        image_plots=values["image_plots"],
    )
    if report.images is None and config.image_gates != type(config.image_gates)():  # a gate on
        typer.echo("warning: no image statistics to gate (a version written before them)", err=True)
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
    near = report.near_duplicates
    if near is not None and near.across_splits and not config.fail_on_near_duplicates:
        typer.echo(
            f"warning: {near.across_splits} near-duplicate image pairs across the split "
            f"(perceptual hashes within {near.distance} bits)",
            err=True,
        )
        for pair in near.examples[:10]:
            typer.echo(f"warning: {pair}", err=True)
    for line in report.warnings:
        typer.echo(f"warning: {line}", err=True)
    if not report.ok:
        shown = report.problems[: config.max_problems]
        for problem in shown:
            typer.echo(one_line(str(problem)), err=True)
        if report.problem_count > len(shown):
            typer.echo(f"... and {report.problem_count - len(shown)} more problems", err=True)
        if _damaged_where_kept(report, shown):
            m = report.manifest
            typer.echo(
                f"hint: version {m.fingerprint} grew from {m.base} and shares the files of the "
                "shards it kept (hard links, never read when linked), so damage to one is damage "
                "to both; restore the version (`dvc checkout --force`, or `git checkout "
                "dvc.lock && dvc checkout --force` if this run's write recorded it), or `tfshards "
                "write --previous none` (write.previous: none) writes every shard anew as a new "
                "lineage, in which records may change sides of the split",
                err=True,
            )
        report.raise_for_problems()
    typer.echo(report.summary())


def _damaged_where_kept(report: Any, shown: Any) -> bool:
    """Whether a shard's bytes are damaged in a grown version, in a shard it may have kept
    from its base: every damaged one, unless the base beside it says which it kept."""
    import posixpath

    from tfshards import storage
    from tfshards.errors import InputError
    from tfshards.shardset.layout import MANIFEST_NAME
    from tfshards.shardset.manifest import load

    m = report.manifest
    damaged = {p.where for p in shown if any(word in str(p) for word in _DAMAGE)}
    if not m.base or not damaged:
        return False
    base_url = storage.join(posixpath.dirname(m.directory.rstrip("/")), m.base, MANIFEST_NAME)
    try:
        kept = {s.sha256 for s in load(base_url).shards}
    except (InputError, OSError):  # removed (old_versions remove): it may have kept any
        return True
    return any(s.sha256 in kept for s in m.shards if s.name in damaged)


validate_command = one_line_errors(
    stageoptions.command(
        OPTIONS,
        _validate,
        name="validate_command",
        section="validate",
        doc="""Check a shard set against its manifest; exit 1 on any problem.

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

    With --near-duplicates true, every image is also hashed (a perceptual
    hash, each shard's kept in your cache) and pairs across the split within
    --near-duplicate-distance bits are counted: re-encoded, resized or
    slightly cropped copies, the closest printed first.
    """,
    )
)
