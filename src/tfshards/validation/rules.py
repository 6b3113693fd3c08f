"""Validation rules: named functions over one record's parsed fields, or over a whole shard set.

A record rule takes the :class:`Shard` being checked and one :class:`Record`
(its fields as :func:`tfshards.format.exampleparser.outline` finds them,
whichever path, C or Python, parsed it) and returns a problem or None;
:func:`tfshards.validation.recordcheck.check_records` applies :data:`RECORD_RULES` in
order to every record. The first, :func:`conforms_to_schema`, gates the
others: they read the fields it vouched for. A set rule takes the
:class:`ShardSet` and returns its problems; :func:`tfshards.validation.validate.validate`
applies :data:`SET_RULES`. A new rule is one function listed in one of the
two tuples, plus its test.
"""

from __future__ import annotations

import functools
import hashlib
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from tfshards import atomicfile, storage
from tfshards.errors import InputError
from tfshards.format.exampleparser import Outline, outline_problem
from tfshards.format.imageformat import (
    animated_webp,
    claims_image,
    image_problem,
)
from tfshards.format.schema import FeatureSpec
from tfshards.shardset import buckets, diff, grouping, layout, lease
from tfshards.shardset.manifest import Manifest
from tfshards.validation import decoder
from tfshards.validation.duplicates import Duplicate, Duplicates


@dataclass(frozen=True)
class Problem:
    """One thing wrong: in file ``where``, at record ``index`` (byte ``offset``) if any."""

    where: str
    what: str
    index: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        if self.index is None:
            return f"{self.where}: {self.what}"
        return f"{self.where}: record {self.index} at byte {self.offset}: {self.what}"


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Shard:
    """What the record rules know of one shard: its schema and what to check.

    Attributes:
        schema: the features each record must hold, as the manifest lists them.
        image_feature: the feature holding the raw file bytes.
        num_labels: labels in the manifest.
        check_sha: compare the stored ``sha256`` feature with the payload's
            (false for a set written with a transform: the digest is of the
            original file, which the transform may have replaced).
        decode_images: also decode each payload with TensorFlow (:func:`payload_decodes`).
        group_by: the manifest's grouping: each record's ``path`` must name a group.
        bucket: ``(bucket, count)``: the shard's split bucket among the set's, which
            each record's key must hash to; None for a set written before buckets.
    """

    schema: tuple[FeatureSpec, ...]
    image_feature: str
    num_labels: int
    check_sha: bool = True
    decode_images: bool = False
    group_by: grouping.GroupBy | None = None
    bucket: tuple[int, int] | None = None

    def scalar(self, name: str, dtype: str) -> bool:
        """Whether the schema holds ``name`` as one value of ``dtype``."""
        return any(s.name == name and s.dtype == dtype and s.size == 1 for s in self.schema)

    # What the schema holds, looked up once per shard rather than once per record.
    @functools.cached_property
    def has_payload(self) -> bool:
        return self.scalar(self.image_feature, "bytes")

    @functools.cached_property
    def has_label(self) -> bool:
        return self.scalar("label", "int64")

    @functools.cached_property
    def has_sha256(self) -> bool:
        return self.scalar("sha256", "bytes")

    @functools.cached_property
    def has_path(self) -> bool:
        return self.scalar("path", "bytes")


class Record(NamedTuple):
    """One record's parsed fields (the features the schema names), and where it is."""

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: record number
    offset: int
    fields: Mapping[str, Outline]

    def first(self, name: str, default: Any) -> Any:
        """The value of a one-value feature, else ``default``."""
        feature = self.fields.get(name)
        return feature.first if feature is not None and feature.size == 1 else default


RecordRule = Callable[[Shard, Record], "str | None"]


def conforms_to_schema(shard: Shard, record: Record) -> str | None:
    """Every feature of the schema is there, of its dtype and size."""
    return outline_problem(record.fields, shard.schema)


def label_in_range(shard: Shard, record: Record) -> str | None:
    """A ``label`` indexes the manifest's labels."""
    if not shard.has_label:
        return None
    label, n = record.first("label", 0), shard.num_labels
    if 0 <= label < n:
        return None
    return f"label out of range: expected 0..{n - 1} ({n} labels), found {label}"


def path_names_a_group(shard: Shard, record: Record) -> str | None:
    """With the manifest's ``group_by``: the pattern matches the record's ``path``."""
    if shard.group_by is None or not shard.has_path:
        return None
    name = bytes(record.first("path", b"")).decode("utf-8", "replace")
    try:
        if shard.group_by.key(name) is not None:
            return None
    except InputError as exc:  # over the time limit: names the path and the pattern
        return str(exc)
    return (
        f"path {name!r}: expected a match of the manifest's group_by "
        f"'{shard.group_by.pattern}', {shard.group_by.miss(name)}"
    )


def in_the_shards_bucket(shard: Shard, record: Record) -> str | None:
    """In a bucketed set, the record's key (its ``path``, or its ``group_by`` group)
    hashes to the shard's split bucket: else the split the loader makes from the
    manifest is not the writer's, and records may sit on the wrong side."""
    if shard.bucket is None or not shard.has_path:
        return None
    bucket, count = shard.bucket
    if not 0 <= bucket < count:  # said once for the set (buckets_in_range)
        return None
    raw = bytes(record.first("path", b""))
    try:
        name = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return f"path {raw!r}: expected UTF-8 text (a listed path), found other bytes"
    try:
        key = name if shard.group_by is None else shard.group_by.key(name)
    except InputError:  # over the time limit: path_names_a_group says so
        return None
    if key is None:  # path_names_a_group says so
        return None
    found = buckets.bucket_of(key, count)
    if found == bucket:
        return None
    return (
        f"split bucket of {key!r}: expected {bucket} (the shard's, by the manifest), found "
        f"{found} of {count}"
    )


def sha256_matches_payload(shard: Shard, record: Record) -> str | None:
    """The stored ``sha256`` feature is the hex SHA-256 of the payload."""
    if not (shard.check_sha and shard.has_payload and shard.has_sha256):
        return None
    stored = record.first("sha256", b"")
    digest = hashlib.sha256(record.first(shard.image_feature, b"")).hexdigest().encode()
    if digest == stored:
        return None
    return (
        f"feature 'sha256' does not match the sha256 of feature {shard.image_feature!r}: "
        f"expected {digest.decode()}, found {bytes(stored).decode('ascii', 'backslashreplace')}"
    )


def payload_is_whole_image(shard: Shard, record: Record) -> str | None:
    """A payload whose ``path`` names an image starts like a known image format, and a
    JPEG or PNG one does not stop before the format's end.

    The writer's own rule (:mod:`tfshards.format.imageformat`), for shards
    from anywhere; a header and an end marker cost little to look at, unlike
    a decode. It holds whatever transform wrote the set: the loader decodes
    the payload feature as an image, so bytes of another kind belong in
    another feature.
    """
    if not (shard.has_payload and shard.has_path):
        return None
    name = bytes(record.first("path", b"")).decode("utf-8", "replace")
    if not claims_image(name):
        return None
    payload = record.first(shard.image_feature, b"")
    problem = image_problem(payload)
    if problem is None:
        return None
    return f"feature {shard.image_feature!r} of {name}: {problem.problem(len(payload))}"


def payload_decodes(shard: Shard, record: Record) -> str | None:
    """With ``decode_images``: TensorFlow's ``decode_image``, the decoder training uses,
    decodes the payload.

    Not Pillow: the two disagree both ways (a PNG with a bad CRC in its last
    chunk, or a JPEG whose end marker is inside a comment, decodes in Pillow
    and stops training; a PNG with a bad CRC in a text chunk, or a 14,000 x
    13,000 JPEG over Pillow's size guard, trains fine), so a check by Pillow
    missed the one and named the other in place of the record at fault.
    """
    if not (shard.decode_images and shard.has_payload):
        return None
    payload = record.first(shard.image_feature, b"")
    if animated_webp(payload):
        return None  # it aborts the decoder's process: payload_is_whole_image names it
    why = decoder.refuses(payload)
    if why is None:
        return None
    source = bytes(record.first("path", b"")).decode("utf-8", "replace")
    of = f" of {source}" if source else ""  # the raw file it came from, when recorded
    return f"feature {shard.image_feature!r}{of} does not decode as an image: {why}"


RECORD_RULES: tuple[RecordRule, ...] = (
    conforms_to_schema,
    label_in_range,
    path_names_a_group,
    in_the_shards_bucket,
    sha256_matches_payload,
    payload_is_whole_image,
    payload_decodes,
)


# ----------------------------------------------------------------------------- sets


@dataclass(frozen=True)
class ShardSet:
    """What the set rules know: the manifest, its version directory, what the shards held."""

    manifest: Manifest
    source: str  # the manifest's URL, as given
    fs: Any
    root: str  # the version directory on ``fs``
    records: int  # found in all shards
    duplicates: Duplicates
    fail_on_leakage: bool = False
    fail_on_label_conflict: bool = True
    groups: grouping.Spread | None = None  # None: the set was written without group_by


class Findings(NamedTuple):
    """A set rule's problems, and how many it counts (a rule may show fewer than it counts)."""

    problems: list[Problem]
    total: int


SetRule = Callable[[ShardSet], Findings]


def _each(problems: list[Problem]) -> Findings:
    return Findings(problems, len(problems))


def _manifest_name(shards: ShardSet) -> str:
    return posixpath.basename(shards.source.rstrip("/")) or shards.source


def total_records_match(shards: ShardSet) -> Findings:
    """The shards hold the records the manifest counts."""
    want = shards.manifest.records
    if shards.records == want:
        return _each([])
    what = f"total record count mismatch: expected {want}, found {shards.records}"
    return _each([Problem(_manifest_name(shards), what)])


def inputs_add_up(shards: ShardSet) -> Findings:
    """The manifest's own accounting: every listed input was written or rejected."""
    m = shards.manifest
    if m.listed == m.records + len(m.rejected):
        return _each([])
    what = (
        f"inputs do not add up: expected {m.listed} listed = records + rejected, "
        f"found {m.records} + {len(m.rejected)}"
    )
    return _each([Problem(_manifest_name(shards), what)])


def named_like_its_folder(shards: ShardSet) -> Findings:
    """The manifest's fingerprint is its version folder's name (a hand edit changes one)."""
    folder = posixpath.basename(shards.root.rstrip("/"))
    if shards.manifest.fingerprint == folder:
        return _each([])
    what = f"expected the fingerprint {folder} (its version folder's name), found "
    return _each([Problem(_manifest_name(shards), what + repr(shards.manifest.fingerprint))])


def no_unlisted_files(shards: ShardSet) -> Findings:
    """Nothing in the version directory that the manifest does not account for."""
    return _each(unlisted_files(shards.fs, shards.root, shards.manifest))


def metadata_files_match(shards: ShardSet) -> Findings:
    """The version directory's other files (tfds metadata) match their sha256 in the manifest."""
    return _each(metadata_problems(shards.fs, shards.root, shards.manifest))


LABEL_FILE = "label.labels.txt"  # one name a line: tfshards.shardset.datasetinfo writes it


def labels_match_label_file(shards: ShardSet) -> Findings:
    """The manifest's labels are the names, in order, of the version's tfds label file.

    The file was written with the manifest and its sha256 is in it: labels
    edited in the manifest alone (another order, a renamed class) would give
    every record another class's name. A file that no longer matches its
    sha256 is no witness (:func:`metadata_files_match` reports it).
    """
    m = shards.manifest
    if LABEL_FILE not in m.metadata_files:
        return _each([])
    try:
        data = storage.read_bytes(shards.fs, storage.join(shards.root, LABEL_FILE))
    except OSError:
        return _each([])  # reported by metadata_files_match
    if (
        hashlib.sha256(data).hexdigest() != m.metadata_files[LABEL_FILE]
        or data == "".join(f"{label}\n" for label in m.labels).encode()
    ):
        return _each([])
    names, have = data.decode("utf-8", "replace").removesuffix("\n").split("\n"), list(m.labels)
    differ = (i for i, pair in enumerate(zip(names, have, strict=False)) if pair[0] != pair[1])
    at = next(differ, min(len(names), len(have)))  # the first label that differs
    what = (
        f"labels: expected the {len(names)} names of {LABEL_FILE}, found {len(have)} "
        f"(from label {at}: {names[at : at + 3]} in the file, {have[at : at + 3]} here)"
    )
    return _each([Problem(_manifest_name(shards), what)])


def groups_in_one_shard(shards: ShardSet) -> Findings:
    """A set written with ``group_by`` holds each group in one shard."""
    spread = shards.groups
    if spread is None or spread.example is None:
        return _each([])
    key, a, b = spread.example
    pattern = shards.manifest.group_by
    what = (
        f"groups across shards: expected 0 under group_by '{pattern}', "
        f"found {spread.spanning} (group {key!r} is in {a} and {b})"
    )
    return _each([Problem(_manifest_name(shards), what)])


def _failing_duplicates(
    shards: ShardSet, option: str, count: int, shown: Callable[[Duplicate], bool]
) -> Findings:
    """The duplicates a ``fail_on_*`` option turns into problems: ``count``, the ``shown`` ones."""
    if not (getattr(shards, option) and count):
        return _each([])
    dups = shards.duplicates.examples
    kept = [Problem(d.first[0], f"{d.what} ({option} is true)") for d in dups if shown(d)]
    return Findings(kept, count)


def no_leakage_across_splits(shards: ShardSet) -> Findings:
    """With ``fail_on_leakage``: no payload in both training and validation records."""
    across = shards.duplicates.across_splits
    return _failing_duplicates(shards, "fail_on_leakage", across, lambda d: d.across_splits)


def one_label_per_payload(shards: ShardSet) -> Findings:
    """With ``fail_on_label_conflict``: no payload carries two labels (the same image twice)."""
    conflicts = shards.duplicates.label_conflicts
    return _failing_duplicates(
        shards, "fail_on_label_conflict", conflicts, lambda d: d.conflict is not None
    )


def records_keep_their_split_side(shards: ShardSet) -> Findings:
    """A set grown from a base moved no surviving record to another split bucket.

    A record's side of the split is its bucket's, so a record of the base's
    training side can reach this version's validation side only by changing
    bucket: the writer counts those (``changes.moved_buckets``); it must be 0.
    """
    m = shards.manifest
    moved = m.changes.get("moved_buckets", 0)
    if not moved:
        return _each([])
    what = (
        f"split: expected 0 records of the base version {m.base} in another split bucket, "
        f"found {moved}: they may have crossed between training and validation"
    )
    return _each([Problem(_manifest_name(shards), what)])


def moved_files_keep_their_split_side(shards: ShardSet) -> Findings:
    """With ``fail_on_leakage``: no file moved or renamed since the base version (the same
    bytes under another path: a label fixed by moving the file, a folder renamed) went to
    another split bucket. Without it, validate warns
    (:func:`tfshards.shardset.diff.moved_files_line`)."""
    line = diff.moved_files_line(shards.manifest)
    if not (shards.fail_on_leakage and line):
        return _each([])
    return _each([Problem(_manifest_name(shards), f"{line} (fail_on_leakage is true)")])


def buckets_in_range(shards: ShardSet) -> Findings:
    """A bucketed set (``params.buckets``, or a shard with a bucket) says its bucket count
    as a whole number in ``[1, MAX_BUCKETS]``, gives every shard a bucket, each below it."""
    m = shards.manifest
    count = m.params.get("buckets")
    have = [s for s in m.shards if s.bucket is not None]
    if count is None and not have:
        return _each([])  # written before buckets
    name = _manifest_name(shards)
    if not buckets.is_count(count):
        most = buckets.MAX_BUCKETS
        what = f"params.buckets: expected a whole number in [1, {most}], found {count!r}"
        return _each([Problem(name, what)])
    problems = [
        Problem(
            s.name, f"split bucket: expected 0..{count - 1} ({count} buckets), found {s.bucket}"
        )
        for s in have
        if not 0 <= s.bucket < count  # type: ignore[operator]
    ]
    if len(have) < len(m.shards):
        first = next(s.name for s in m.shards if s.bucket is None)
        what = (
            f"split buckets: expected one for every shard of a bucketed set, found none for "
            f"{len(m.shards) - len(have)} (first {first}): the split would go by file instead"
        )
        problems.append(Problem(name, what))
    return _each(problems)


SET_RULES: tuple[SetRule, ...] = (
    total_records_match,
    named_like_its_folder,
    inputs_add_up,
    no_unlisted_files,
    metadata_files_match,
    labels_match_label_file,
    groups_in_one_shard,
    no_leakage_across_splits,
    one_label_per_payload,
    records_keep_their_split_side,
    moved_files_keep_their_split_side,
    buckets_in_range,
)


def unlisted_files(fs: Any, root: str, manifest: Manifest) -> list[Problem]:
    """Files in the version directory that the manifest does not account for.

    What may be there is declared once, in :mod:`tfshards.shardset.layout` (the
    manifest, the shards and their bookkeeping files in its subfolders); a
    temp file of :class:`~tfshards.atomicfile.AtomicSink` is reported as stale.
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
        if not rel or rel in expected or rel in layout.FOLDERS or lease.is_lease(rel):
            continue  # a lease: a writer is re-writing the set (or was killed doing so)
        if any(rel.startswith(folder) for folder in foreign):
            continue
        if atomicfile.is_temp_name(posixpath.basename(rel)):
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


def apply_set_rules(shards: ShardSet, rules: Sequence[SetRule] = SET_RULES) -> Findings:
    """Every set rule's problems, in rule order, and their count."""
    problems: list[Problem] = []
    count = 0
    for rule in rules:
        found = rule(shards)
        problems += found.problems
        count += found.total
    return Findings(problems, count)
