"""Check a shard set against its manifest: file bytes, framing, records, labels, files, copies.

Each shard is one task (:func:`tfshards.validation.shardcheck.validate_shard`) on plain
values, run on any executor. Nothing stops at the first problem: every
problem is counted, and the first ``max_problems`` of each shard kept, with
where it is (shard, record index, byte offset; offsets count in the
decompressed stream for gzip/zlib shards) and what was expected and found.
Memory does not grow with what a shard holds (see :mod:`tfshards.validation.shardcheck`).
The records go through the record rules (:func:`tfshards.validation.recordcheck.check_records`),
the whole set through the set rules (:data:`tfshards.validation.rules.SET_RULES`).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfshards import jsonfile, storage
from tfshards.errors import ValidationError
from tfshards.format import phash
from tfshards.progress import Progress
from tfshards.run import executor as executors
from tfshards.run.executor import Needs
from tfshards.shardset import diff, grouping, layout
from tfshards.shardset import split as splits
from tfshards.shardset.manifest import Manifest, load
from tfshards.validation import imagegates, nearduplicates, rules
from tfshards.validation.config import ValidateConfig
from tfshards.validation.duplicates import DigestStore, Duplicates, with_label_names, with_paths
from tfshards.validation.nearduplicates import NearDuplicates
from tfshards.validation.rules import Problem
from tfshards.validation.shardcheck import ShardCheck, ShardReport, validate_shard

ANIMATED = ("GIF", "WebP")  # formats tf.image.decode_image gives as frames (4-D)

__all__ = [
    "ValidateConfig",
    "ValidationReport",
    "validate",
    "write_metrics",
    "write_outputs",
]


@dataclass(frozen=True)
class ValidationReport:
    """The result of :func:`validate`; ``ok`` when no problem was found."""

    manifest: Manifest
    records: int
    bytes: int
    records_per_label: Mapping[str, int]
    problems: tuple[Problem, ...]  # in manifest order; at most ``max_problems`` per file
    problem_count: int
    seconds: float
    duplicates: Duplicates = field(default_factory=Duplicates)
    # Records per label on each side of the split: {"train": {label: n}, "val": {...}}.
    split_counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # class balance, moved files, ...: not problems
    balance_warnings: int = 0  # of them, about class balance across the split
    groups: grouping.Spread | None = None  # None: the set was written without group_by
    images: imagegates.SideStats | None = None  # None: written before image statistics
    near_duplicates: NearDuplicates | None = None  # None: the check was off

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def _growth(self) -> dict[str, int]:
        return dict(sorted({"moved_files": 0, **self.manifest.changes}.items()))

    def metrics(self) -> dict[str, Any]:
        """Byte-stable metrics for DVC (no timings), the verdict first.

        Records per label, on each side, are the balance plots
        (:func:`write_outputs`); the metrics stay few so ``dvc exp show``
        stays narrow.
        """
        return {
            "ok": self.ok,
            "problems": self.problem_count,
            "records": self.records,
            "split": {
                **{
                    side: {"records": sum(counts.values())}
                    for side, counts in self.split_counts.items()
                },
                "balance_warnings": self.balance_warnings,
            },
            "duplicates": self.duplicates.metrics(),
            **({"grouping": self.groups.metrics()} if self.groups is not None else {}),
            # What changed since the version this one grew from (absent: written from scratch);
            # the manifest keeps moved_files only when there are any: here always, as a key
            # that comes and goes reads as a change in `dvc metrics diff`.
            **({"growth": self._growth()} if self.manifest.changes else {}),
            **({"near_duplicates": self._near_metrics(n)} if (n := self.near_duplicates) else {}),
            "rejected_inputs": len(self.manifest.rejected),
            "shards": len(self.manifest.shards),
            "bytes": self.bytes,
        }

    def _near_metrics(self, near: NearDuplicates) -> dict[str, int | None]:
        """``across_splits`` null with no validation side: no pair was compared (a 0
        read as a clean set)."""
        compared = sum(self.split_counts.get("val", {}).values()) > 0
        return {**near.metrics(), **({} if compared else {"across_splits": None})}

    def summary(self) -> str:
        m = self.manifest
        n = self.problem_count
        verdict = "OK" if self.ok else f"{n} problem{'s' if n != 1 else ''}"
        return (
            f"validated {self.records} records in {len(m.shards)} shards "
            f"({self.bytes / 1e6:.1f} MB) in {self.seconds:.1f} s: {verdict}"
        )

    def raise_for_problems(self) -> None:
        """Raise :class:`ValidationError` (``problems``: each line) unless ``ok``."""
        if not self.ok:
            raise ValidationError(
                f"{self.summary()} in {self.manifest.directory}",
                problems=[str(p) for p in self.problems],
                problem_count=self.problem_count,
            )


# ----------------------------------------------------------------------------- run


def validate(config: ValidateConfig, *, progress: bool = False) -> ValidationReport:
    """Check every shard the manifest at ``config.manifest`` lists, and its version directory.

    Never stops at the first problem; see :class:`ValidationReport` for what
    comes back. Raises only when the manifest itself cannot be read
    (:class:`~tfshards.errors.InputError`) or the config is impossible.
    """
    start = time.monotonic()
    manifest = load(config.manifest, **config.storage_options)
    fs, root = storage.open_url(manifest.directory, **config.storage_options)
    tasks = [
        ShardCheck.of(
            manifest,
            shard,
            decode_images=config.decode_images,
            near_duplicates=config.near_duplicates,
            max_problems=config.max_problems,
            storage_options=config.storage_options,
        )
        for shard in manifest.shards
    ]
    part = _split(manifest, config)
    done, dups = _check_shards(config, manifest, fs, tasks, part, progress)
    problems = [p for r in done for p in r.problems]
    count = sum(r.problem_count for r in done)
    per_label = [sum(r.label_counts[i] for r in done) for i in range(len(manifest.labels))]
    sound = {r.name for r in done if not r.problem_count}
    if dups.examples:
        dups = with_paths(
            dups, manifest.directory, manifest.compression, sound, config.storage_options
        )
        dups = with_label_names(dups, manifest.labels)
    spread = None
    if manifest.group_by is not None:
        spread = grouping.spread([r.name for r in done], [r.groups for r in done])
    shard_set = rules.ShardSet(
        manifest,
        config.manifest,
        fs,
        root,
        records=sum(r.records for r in done),
        duplicates=dups,
        fail_on_leakage=config.fail_on_leakage,
        fail_on_label_conflict=config.fail_on_label_conflict,
        groups=spread,
    )
    extra = rules.apply_set_rules(shard_set)
    images = imagegates.load(manifest, part, **config.storage_options)
    gated = imagegates.check(images, config.image_gates) if images is not None else []
    val = {s.name for s in part.val}
    near = _near_duplicates(fs, root, manifest, done, val, config)
    if near is not None and config.fail_on_near_duplicates and near.across_splits:
        pairs = [Problem(p.train[0], str(p).split(": ", 1)[1]) for p in near.examples]
        extra = rules.Findings(extra.problems + pairs, extra.total + near.across_splits)
    counts = splits.label_counts(part, {r.name: r.label_counts for r in done}, manifest.labels)
    balance = splits.balance_warnings(counts)
    return ValidationReport(
        manifest=manifest,
        records=sum(r.records for r in done),
        bytes=sum(r.bytes for r in done),
        records_per_label=dict(zip(manifest.labels, per_label, strict=True)),
        problems=tuple(problems + extra.problems[: config.max_problems] + gated),
        problem_count=count + extra.total + len(gated),
        seconds=time.monotonic() - start,
        duplicates=dups,
        split_counts=counts,
        warnings=tuple(balance)
        + _unsplit(near, part)
        + _moved(manifest, config)
        + _not_for_tfds(manifest, images),
        balance_warnings=len(balance),
        groups=spread,
        images=images,
        near_duplicates=near,
    )


def _sample_shards(manifest: Manifest) -> list[str]:
    """The first, middle and last shard: what every worker must see."""
    shards = manifest.shards
    picked = {s.name for s in (shards[0], shards[len(shards) // 2], shards[-1])} if shards else ()
    return [storage.join(storage.absolute(manifest.directory), name) for name in sorted(picked)]


def _moved(manifest: Manifest, config: ValidateConfig) -> tuple[str, ...]:
    """The line on files moved into another split bucket, unless it is a problem here."""
    line = diff.moved_files_line(manifest)
    return (line,) if line and not config.fail_on_leakage else ()


def _not_for_tfds(manifest: Manifest, images: imagegates.SideStats | None) -> tuple[str, ...]:
    """A line when the set's tfds metadata will not read it whole: tfds decodes images with
    ``tf.image.decode_image``, which gives a GIF or WebP as frames (4-D), and stops there."""
    if images is None or manifest.compression != "none":  # a compressed set has no metadata
        return ()
    found = [(fmt, s) for s in images.sides.values() for fmt in ANIMATED if s.formats.get(fmt)]
    if not found:
        return ()
    count = sum(s.formats[fmt] for fmt, s in found)
    examples = [example for fmt, s in found for example in s.format_examples.get(fmt, [])]
    first = f" (one is {min(examples)[1]})" if examples else ""
    kinds = " or ".join(sorted({fmt for fmt, _ in found}))
    are = "record is" if count == 1 else "records are"
    return (
        f"tfds: {count} {are} {kinds}{first}, which "
        "tensorflow-datasets' builder_from_directory decodes as frames and stops on; "
        "tfshards' loader and tf.data read them (store them as PNG to read the set with tfds)",
    )


def _unsplit(near: NearDuplicates | None, part: splits.Split) -> tuple[str, ...]:
    """A line when the near-duplicate check ran with no validation side to compare with."""
    if near is None or part.val:
        return ()
    why = (
        "val_fraction 0"
        if not part.val_fraction
        else f"val_fraction {part.val_fraction} chose no shard of {len(part.train)}"
    )
    return (f"near-duplicates: no validation side ({why}), so no pair was compared",)


def _near_duplicates(
    fs: Any,
    root: str,
    manifest: Manifest,
    done: list[ShardReport],
    val: set[str],
    config: ValidateConfig,
) -> NearDuplicates | None:
    """Near-duplicate pairs across the split, from each shard's hash rows; None when off."""
    if not config.near_duplicates:
        return None
    rows = {r.name: np.frombuffer(r.phashes, dtype=phash.DTYPE) for r in done}
    found = nearduplicates.find(
        rows, val, config.near_duplicate_distance, limit=config.max_problems
    )
    return nearduplicates.with_paths(found, fs, root, {s.name: s for s in manifest.shards})


def _check_shards(
    config: ValidateConfig,
    manifest: Manifest,
    fs: Any,
    tasks: list[ShardCheck],
    part: splits.Split,
    progress: bool,
) -> tuple[list[ShardReport], Duplicates]:
    """Every shard checked on the executor, in manifest order, and the duplicates among them.

    Each shard's record digests are spilled to disk as its report arrives
    (:class:`DigestStore`), so memory holds the reports, never every digest.
    """
    with (
        Progress("validate", total=manifest.records, enabled=progress) as bar,
        DigestStore([t.name for t in tasks], {s.name for s in part.val}, manifest.records) as store,
    ):
        pool = executors.start(config.run, [storage.protocol(fs)], tasks=len(tasks))
        arrived: dict[int, ShardReport] = {}
        with pool:
            for i, report in pool.map(
                validate_shard,
                tasks,
                describe=lambda t: t.name,
                needs=Needs(
                    locations=(storage.absolute(manifest.directory),),
                    inputs=(storage.absolute(manifest.directory),),
                    samples=lambda: _sample_shards(manifest),
                    after="validate writes nothing until its end: run again",
                ),
                note=bar.note,
            ):
                bar.update(report.records, report.bytes)
                store.add(i, report.digests, report.record_labels)  # spilled, never all held
                arrived[i] = dataclasses.replace(report, digests=b"", record_labels=b"")
        done = [arrived[i] for i in range(len(tasks))]
        dups = store.find()
    return done, dups


def _split(manifest: Manifest, config: ValidateConfig) -> splits.Split:
    """The training stage's split of these shards (all training when ``val_fraction`` is 0)."""
    if config.val_fraction == 0 or len(manifest.shards) < 2:  # val_fraction: as asked
        return splits.Split(tuple(manifest.shards), (), config.split_seed, config.val_fraction, 0.0)
    with warnings.catch_warnings():  # an inexact fraction is the training stage's to report
        warnings.simplefilter("ignore", splits.SplitWarning)
        return splits.split(manifest, config.val_fraction, config.split_seed)


def write_metrics(report: ValidationReport, url: str) -> None:
    """Save :meth:`ValidationReport.metrics` as indented JSON in its key order (byte-stable)."""
    write_outputs(report, metrics=url)


def write_outputs(
    report: ValidationReport,
    *,
    metrics: str | None = None,
    balance: str | None = None,
    image_metrics: str | None = None,
    image_plots: str | None = None,
) -> None:
    """Save the outputs asked for, each refused before any is written where it would
    replace a file of another kind (:func:`tfshards.jsonfile.save_outputs`), or lie in
    the version folder checked (a file there fails the next validate).

    ``metrics``: :meth:`ValidationReport.metrics`, in its key order (byte-stable).
    ``balance``: a folder for ``train.json`` and ``val.json``, each side's records per
    label, rows ``{"label", "count"}`` in label order: the data of a DVC bar plot
    (``template: bar_horizontal``, ``x: count``, ``y: label``); a side with no shards
    (``val_fraction`` 0) gets an empty list. ``image_metrics``, ``image_plots``: each
    side's image statistics (:func:`tfshards.validation.imagegates.outputs`).

    Raises:
        ConfigError: an output in the version folder, or one that may not be replaced.
    """
    outputs = []
    if metrics is not None:
        outputs.append(jsonfile.Output(report.metrics(), metrics, ordered=True))
    for side in ("train", "val") if balance is not None else ():
        assert balance is not None
        counts = report.split_counts.get(side, {})
        rows = [{"count": n, "label": label} for label, n in counts.items()]
        url = storage.join(balance, f"{side}.json")
        outputs.append(jsonfile.Output(rows, url, like=[{"count": 0, "label": ""}]))
    outputs += imagegates.outputs(report.images, image_metrics, image_plots)
    for output in outputs:
        layout.refuse_in_version(output.url, "path", read=report.manifest.directory)
    jsonfile.save_outputs(outputs)
