"""Check a shard set against its manifest: file bytes, framing, records, labels, files, copies.

Each shard is one task (:func:`tfshards.validation.shardcheck.validate_shard`) on plain
values, run on any executor. Nothing stops at the first problem: every
problem is counted, and the first ``max_problems`` of each shard kept, with
where it is (shard, record index, byte offset; offsets count in the
decompressed stream for gzip/zlib shards) and what was expected and found.
Memory does not grow with what a shard holds (see :mod:`tfshards.validation.shardcheck`).
The records themselves are checked by :func:`tfshards.bulkcheck.check_records`
(numpy, all records of a shard at once) and :mod:`tfshards.recordcheck`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import bulkcheck, jsonfile, native, storage
from tfshards.errors import ConfigError, ValidationError
from tfshards.progress import Progress
from tfshards.reading import splits
from tfshards.run import executor as executors
from tfshards.run.cluster import Needs
from tfshards.validation.duplicates import DigestStore, Duplicates, with_paths
from tfshards.validation.shardcheck import (
    MAX_PROBLEMS,
    Problem,
    ShardCheck,
    ShardReport,
    validate_shard,
)
from tfshards.writing import grouping, layout
from tfshards.writing.manifest import Manifest, load

__all__ = [
    "ValidateConfig",
    "ValidationReport",
    "metadata_problems",
    "unlisted_files",
    "validate",
    "write_balance",
    "write_metrics",
]


@dataclass(frozen=True)
class ValidateConfig:
    """What to check and how; validated on construction.

    Attributes:
        manifest: URL of the ``manifest.json`` to check (its ``root`` locates the shards).
        decode_images: also decode every image payload with Pillow (slow: ~0.1-1.5 ms each).
        workers: shards checked at once (with processes, this process works too).
        executor: ``auto``, ``process``, ``thread``, ``serial`` or ``dask``.
            ``auto`` means threads when :mod:`tfshards.native` is built and the
            schema takes the bulk path (every per-record loop then runs without
            the GIL), else processes; threads for ``memory://``.
        dask_address: scheduler address for ``executor="dask"`` (None: a local cluster).
        shared_fs: a local shard directory is on a filesystem every Dask worker
            mounts at the same path (without it, a scheduler address refuses it).
        max_problems: problems kept per shard (all are counted).
        storage_options: fsspec options for the manifest and the shards.
        val_fraction: the training split's ``val_fraction`` (0: no split); with
            ``split_seed`` it picks the validation shards as
            :func:`tfshards.reading.splits.split` does, for the per-split counts and
            duplicates across the split.
        split_seed: the training split's seed.
        fail_on_leakage: a payload in both training and validation records is a problem.
    """

    manifest: str
    decode_images: bool = False
    workers: int = 1
    executor: str = "auto"
    dask_address: str | None = None
    shared_fs: bool = False
    max_problems: int = MAX_PROBLEMS
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    val_fraction: float = 0.0
    split_seed: int = 0
    fail_on_leakage: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.max_problems < 1:
            raise ConfigError(f"max_problems must be >= 1, got {self.max_problems}")
        executors.check_options(self.executor, self.workers)

    @property
    def run_options(self) -> executors.RunOptions:
        """Where and how wide the shards are checked."""
        return executors.RunOptions(self.workers, self.executor, self.dask_address, self.shared_fs)


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
    warnings: tuple[str, ...] = ()  # class balance across the split; not problems
    groups: grouping.Spread | None = None  # None: the set was written without group_by

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def metrics(self) -> dict[str, Any]:
        """Byte-stable metrics for DVC (no timings)."""
        return {
            "bytes": self.bytes,
            "duplicates": self.duplicates.metrics(),
            "ok": self.ok,
            "problems": self.problem_count,
            "records": self.records,
            "records_per_label": dict(self.records_per_label),
            "rejected_inputs": len(self.manifest.rejected),
            **({"grouping": self.groups.metrics()} if self.groups is not None else {}),
            "shards": len(self.manifest.shards),
            "split": {
                **{
                    side: {"records": sum(counts.values()), "records_per_label": dict(counts)}
                    for side, counts in self.split_counts.items()
                },
                "balance_warnings": len(self.warnings),
            },
        }

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
                f"{self.summary()} in {self.manifest.root}",
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
    fs, root = storage.open_url(manifest.root, **config.storage_options)
    gil_free = native.NATIVE is not None and bulkcheck.supports(
        manifest.schema, config.decode_images
    )
    tasks = [
        ShardCheck.of(
            manifest,
            shard,
            decode_images=config.decode_images,
            max_problems=config.max_problems,
            storage_options=config.storage_options,
        )
        for shard in manifest.shards
    ]
    part = _split(manifest, config)
    with (
        Progress("validate", total=manifest.records, enabled=progress) as bar,
        DigestStore([t.name for t in tasks], {s.name for s in part.val}, manifest.records) as store,
    ):
        pool = executors.start(
            config.run_options, [storage.protocol(fs)], gil_free=gil_free, tasks=len(tasks)
        )
        arrived: dict[int, ShardReport] = {}
        with pool:
            for i, report in pool.map(
                validate_shard,
                tasks,
                describe=lambda t: t.name,
                needs=Needs(
                    locations=(storage.absolute(manifest.root),),
                    inputs=(storage.absolute(manifest.root),),
                ),
                note=bar.note,
            ):
                bar.update(report.records, report.bytes)
                store.add(i, report.digests)  # spilled: never all shards' digests at once
                arrived[i] = dataclasses.replace(report, digests=b"")
        done = [arrived[i] for i in range(len(tasks))]
        dups = store.find()
    problems = [p for r in done for p in r.problems]
    count = sum(r.problem_count for r in done)
    extra = _manifest_problems(manifest, config.manifest, done)
    extra += unlisted_files(fs, root, manifest)
    extra += metadata_problems(fs, root, manifest)
    per_label = [sum(r.label_counts[i] for r in done) for i in range(len(manifest.labels))]
    if dups.examples:
        sound = [r.name for r in done if not r.problem_count]
        dups = with_paths(dups, manifest.root, manifest.compression, sound, config.storage_options)
    leaks = []
    if config.fail_on_leakage and dups.across_splits:
        leaks = [
            Problem(d.first[0], f"{d.what} (fail_on_leakage is true)")
            for d in dups.examples
            if d.across_splits
        ]
    spread = None
    if manifest.params.get("group_by") is not None:
        spread = grouping.spread([r.name for r in done], [r.groups for r in done])
        extra += _spread_problems(manifest, config.manifest, spread)
    counts = splits.label_counts(part, {r.name: r.label_counts for r in done}, manifest.labels)
    return ValidationReport(
        manifest=manifest,
        records=sum(r.records for r in done),
        bytes=sum(r.bytes for r in done),
        records_per_label=dict(zip(manifest.labels, per_label, strict=True)),
        problems=tuple(problems + (extra + leaks)[: config.max_problems]),
        problem_count=count + len(extra) + (dups.across_splits if leaks else 0),
        seconds=time.monotonic() - start,
        duplicates=dups,
        split_counts=counts,
        warnings=tuple(splits.balance_warnings(counts)),
        groups=spread,
    )


def _spread_problems(manifest: Manifest, source: str, spread: grouping.Spread) -> list[Problem]:
    """A set written with ``group_by`` must hold each group in one shard."""
    if spread.example is None:
        return []
    key, a, b = spread.example
    pattern = manifest.params["group_by"]
    where = posixpath.basename(source.rstrip("/")) or source
    return [
        Problem(
            where,
            f"groups across shards: expected 0 under group_by '{pattern}', "
            f"found {spread.spanning} (group {key!r} is in {a} and {b})",
        )
    ]


def _split(manifest: Manifest, config: ValidateConfig) -> splits.Split:
    """The training stage's split of these shards (all training when ``val_fraction`` is 0)."""
    if config.val_fraction == 0 or len(manifest.shards) < 2:
        return splits.Split(tuple(manifest.shards), (), config.split_seed, 0.0, 0.0)
    with warnings.catch_warnings():  # an inexact fraction is the training stage's to report
        warnings.simplefilter("ignore", splits.SplitWarning)
        return splits.split(manifest, config.val_fraction, config.split_seed)


def _manifest_problems(
    manifest: Manifest, source: str, reports: Sequence[ShardReport]
) -> list[Problem]:
    """Totals that disagree: records found in all, and the manifest's own accounting."""
    where = posixpath.basename(source.rstrip("/")) or source
    out = []
    found = sum(r.records for r in reports)
    if found != manifest.records:
        out.append(
            Problem(
                where, f"total record count mismatch: expected {manifest.records}, found {found}"
            )
        )
    if manifest.listed != manifest.records + len(manifest.rejected):
        out.append(
            Problem(
                where,
                f"inputs do not add up: expected {manifest.listed} listed = records + rejected, "
                f"found {manifest.records} + {len(manifest.rejected)}",
            )
        )
    return out


def unlisted_files(fs: Any, root: str, manifest: Manifest) -> list[Problem]:
    """Files in the version directory that the manifest does not account for.

    What may be there is declared once, in :mod:`tfshards.writing.layout` (the
    manifest, the shards and their bookkeeping files in its subfolders); a
    temp file of :class:`~tfshards.storage.AtomicSink` is reported as stale.
    """
    try:
        entries = fs.find(root, withdirs=True, detail=True)
    except FileNotFoundError:
        return []  # every shard reports itself missing
    expected = layout.expected_paths(s.name for s in manifest.shards)
    base = root.rstrip("/") + "/"
    out = []
    foreign: list[str] = []  # unexpected folders: reported once, not file by file
    for name in sorted(entries):
        if not str(name).startswith(base):
            continue  # the version directory itself
        rel = str(name)[len(base) :].rstrip("/")
        if not rel or rel in expected or rel in layout.FOLDERS:
            continue
        if any(rel.startswith(folder) for folder in foreign):
            continue
        if storage.is_temp_name(posixpath.basename(rel)):
            what = "stale temp file (a writer stopped before publishing it)"
        elif entries[name].get("type") == "directory":
            what = "directory not listed in the manifest"
            foreign.append(rel + "/")
        else:
            what = "file not listed in the manifest"
        out.append(Problem(rel, what))
    return out


def metadata_problems(fs: Any, root: str, manifest: Manifest) -> list[Problem]:
    """The version directory's other files (tfds metadata) against their sha256 in the manifest."""
    out = []
    for rel, want in sorted(manifest.metadata_files.items()):
        try:
            data = storage.read_bytes(fs, storage.join(root, rel))
        except FileNotFoundError:
            out.append(Problem(rel, "missing: expected a file the manifest lists"))
            continue
        except OSError as exc:
            out.append(Problem(rel, f"cannot read: {exc.strerror or exc}"))
            continue
        found = hashlib.sha256(data).hexdigest()
        if found != want:
            out.append(Problem(rel, f"sha256 mismatch: expected {want}, found {found}"))
    return out


def write_metrics(report: ValidationReport, url: str) -> None:
    """Save :meth:`ValidationReport.metrics` as sorted, indented JSON (byte-stable)."""
    _write_json(report.metrics(), url)


def write_balance(report: ValidationReport, folder: str) -> None:
    """Save each side's records per label as ``folder/train.json`` and ``folder/val.json``.

    Rows ``{"label": ..., "count": ...}`` in label order: the data of a DVC bar
    plot (``template: bar_horizontal``, ``x: count``, ``y: label``). A side
    with no shards (``val_fraction`` 0) gets an empty list.
    """
    for side in ("train", "val"):
        counts = report.split_counts.get(side, {})
        rows = [{"count": n, "label": label} for label, n in counts.items()]
        _write_json(rows, storage.join(folder, f"{side}.json"))


def _write_json(doc: Any, url: str) -> None:
    jsonfile.save(doc, url)
