"""What changed between two versions, from their manifests and member lists alone.

Each shard's member list (:mod:`tfshards.shardset.members`) names its records
by listed path, content token and label id, so two versions compare without
reading a shard. A record is the same record in both when its path is; then
its token says whether its bytes changed, its label *name* (each version's
ids mapped through its own ``labels``) whether it was relabeled, and its
shard's bucket whether it crossed split buckets.

Memory: the old version is held as one dict entry per record (path -> token,
label name, bucket); the new one is streamed shard by shard against it.
1,000,000 records a side: see ``python -m bench.studies.diff_scale``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import storage
from tfshards.errors import InputError
from tfshards.shardset import buckets, members
from tfshards.shardset.manifest import Manifest, ShardInfo, named_labels
from tfshards.shardset.members import Row

# One shard and its members, in record order: what :func:`load_members` yields.
ShardMembers = tuple[ShardInfo, Sequence[Row]]  # rows as parsed: 1,000,000 Members cost 0.9 s more


@dataclass(frozen=True)
class Changes:
    """The differences from an old version to a new one, record by record and label by label.

    ``moved_buckets`` is None when the two are not comparable by bucket
    (``buckets_note`` says why): a shard without a bucket (written before
    split buckets), or another bucket count.
    """

    added: int
    removed: int
    changed: int  # same path, another content token
    relabeled: int  # same path and token, another label name
    unchanged: int
    added_paths: tuple[str, ...] = ()  # sorted, as are the three below
    removed_paths: tuple[str, ...] = ()
    changed_paths: tuple[str, ...] = ()
    relabeled_paths: tuple[str, ...] = ()
    label_deltas: Mapping[str, int] = field(default_factory=dict)  # name: new - old, non-zero
    labels_added: tuple[str, ...] = ()  # names in the new label map only
    labels_removed: tuple[str, ...] = ()  # names in the old label map only
    # labels both maps hold that had records and have none now (a renamed folder: the id
    # stays, and with it a model's output for a class with no records)
    labels_emptied: tuple[str, ...] = ()
    ids_changed: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # (old, new) id
    moved_buckets: int | None = None  # records in both whose shard's bucket differs
    buckets_note: str = ""
    # (old path, new path) of bytes that left one path and are new at another (removed
    # or replaced there; added or replacing here): a file moved or renamed; sorted
    moved_paths: tuple[tuple[str, str], ...] = ()
    # of those, how many changed bucket at the least (0 when not comparable): what the
    # writer keeps as ``changes.moved_files``
    moved_files: int = 0

    def to_metrics(self) -> dict[str, int | None]:
        """Flat counts for ``dvc metrics diff``, the same keys every time (a key that comes
        and goes reads as a change); ``moved_buckets`` and ``moved_files`` are None (JSON
        null) when the two versions' buckets cannot be compared."""
        doc: dict[str, int | None] = {
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "relabeled": self.relabeled,
            "unchanged": self.unchanged,
            "labels_added": len(self.labels_added),
            "labels_removed": len(self.labels_removed),
            "labels_emptied": len(self.labels_emptied),
            "ids_changed": len(self.ids_changed),
            "moved_paths": len(self.moved_paths),
            "moved_files": None if self.moved_buckets is None else self.moved_files,
            "moved_buckets": self.moved_buckets,
        }
        return doc

    def lines(self) -> list[str]:
        """A short human summary: counts, label deltas, label map changes, buckets."""
        out = [
            f"records: {self.added} added, {self.removed} removed, {self.changed} changed, "
            f"{self.relabeled} relabeled, {self.unchanged} unchanged"
        ]
        shared = self.changed or self.relabeled or self.unchanged or self.moved_paths
        if self.added and self.removed and not shared:
            out.append("note: no path is in both versions: are they versions of one data set?")
        if self.label_deltas:
            deltas = ", ".join(f"{name} {n:+d}" for name, n in self.label_deltas.items())
            out.append(f"records per label: {deltas}")
        if self.labels_added:
            out.append(f"labels added: {', '.join(self.labels_added)}")
        if self.labels_removed:
            out.append(f"labels removed: {', '.join(self.labels_removed)}")
        if self.labels_emptied:
            out.append(
                f"labels now without records: {', '.join(self.labels_emptied)} (their ids "
                "stay, and a model's outputs for them; write.labels without them and "
                "--relabel drop them)"
            )
        if self.ids_changed:
            moved = ", ".join(f"{n} {a}->{b}" for n, (a, b) in self.ids_changed.items())
            out.append(f"label ids changed: {moved}")
        if self.moved_buckets is None:
            out.append(f"buckets: not comparable ({self.buckets_note})")
        else:
            out.append(
                f"buckets: {self.moved_buckets} records under the same path moved to another bucket"
            )
        if self.moved_paths:
            n = len(self.moved_paths)
            crossed = (
                f", {self.moved_files} of them to another bucket: they may have crossed "
                "between training and validation (the split follows each record's key)"
                if self.moved_files
                else ""
            )
            out.append(f"moved: {n} files' bytes are now under another path{crossed}")
        return out


def moved_files_line(manifest: Manifest) -> str:
    """What the writer counted as files moved or renamed into another split bucket ("": none).

    A record's bucket follows its key, the path, so such a file may have crossed between
    training and validation: the model scored on what it trained on.
    """
    moved = manifest.changes.get("moved_files", 0)
    if not moved:
        return ""
    if manifest.params.get("group_by") is None:
        key = "path"
        keep = (
            "key records by file name (write.group_by: '[^/]+$', which a lineage takes from "
            "its first version: with write.previous: none once, where records may change "
            "sides that one time)"
        )
    else:
        key = "group_by group"
        keep = "choose a group_by that a move leaves alone"
    return (
        f"split: {moved} file{'s' if moved != 1 else ''} moved or renamed since version "
        f"{manifest.base} (the same bytes "
        f"under another {key}) went to another split bucket, so they may have crossed between "
        f"training and validation; to keep a file's side when it moves, {keep}, or fix "
        "labels in an index file"
    )


def compare(
    old: Manifest,
    new: Manifest,
    old_members: Iterable[ShardMembers],
    new_members: Iterable[ShardMembers],
) -> Changes:
    """The changes from ``old`` to ``new``, given each one's shards with their members.

    Raises:
        InputError: a path listed twice in one version, or a label id outside
            its manifest's labels.
    """
    note = _buckets_note(old, new)
    known = _index_old(old, old_members, use_buckets=not note)
    names = new.labels
    new_counts = [0] * len(names)
    added: list[str] = []
    changed: list[str] = []
    relabeled: list[str] = []
    fresh: dict[str, tuple[str, int | None]] = {}  # path -> the token and bucket new there
    left: list[tuple[str, str, int | None]] = []  # (token, path, bucket) of bytes that left
    unchanged = moved = 0
    for shard, rows in new_members:
        bucket = shard.bucket if not note else None
        for path, token, label in rows:
            if label >= len(names):
                raise _outside(new, label, path)
            new_counts[label] += 1
            seen = known.old.get(path, _ABSENT)
            if seen is _ABSENT:
                added.append(path)
                fresh[path] = (token, bucket)
                continue
            if seen is None:
                raise _twice(new, path)
            known.old[path] = None  # matched; a second match is a repeated path
            old_token, old_name, old_bucket = seen
            if old_token != token:
                changed.append(path)
                left.append((old_token, path, old_bucket))  # its bytes left this path
                fresh[path] = (token, bucket)  # and these arrived
            elif old_name != names[label]:
                relabeled.append(path)
            else:
                unchanged += 1
            moved += old_bucket != bucket
    removed = sorted(path for path, entry in known.old.items() if entry is not None)
    for path in removed:
        token, _, bucket = known.old[path] or ("", "", None)
        left.append((token, path, bucket))
    moves, crossed = _moves(left, fresh)
    added.sort()
    for before, path in itertools.pairwise(added):  # a new path listed twice is added twice
        if before == path:
            raise _twice(new, path)
    return Changes(
        added=len(added),
        removed=len(removed),
        changed=len(changed),
        relabeled=len(relabeled),
        unchanged=unchanged,
        added_paths=tuple(added),
        removed_paths=tuple(removed),
        changed_paths=tuple(sorted(changed)),
        relabeled_paths=tuple(sorted(relabeled)),
        label_deltas=_deltas(old.labels, known.counts, new.labels, new_counts),
        labels_added=tuple(sorted(_named(new) - _named(old))),
        labels_removed=tuple(sorted(_named(old) - _named(new))),
        labels_emptied=_emptied(old.labels, known.counts, new.labels, new_counts),
        ids_changed=_ids_changed(old.labels, new.labels),
        moved_buckets=None if note else moved,
        buckets_note=note,
        moved_paths=tuple(moves),
        moved_files=0 if note else crossed,
    )


def _moves(
    left: list[tuple[str, str, int | None]], fresh: Mapping[str, tuple[str, int | None]]
) -> tuple[list[tuple[str, str]], int]:
    """The (old path, new path) pairs of bytes that left one path and are new at another
    (each departure paired with one arrival, both in path order), sorted; and how many
    of them changed bucket at the least (:func:`tfshards.shardset.buckets.crossings`)."""
    gone: dict[str, list[tuple[str, int | None]]] = {}
    for token, path, bucket in sorted(left, key=lambda t: t[1]):
        gone.setdefault(token, []).append((path, bucket))
    came: dict[str, list[tuple[str, int | None]]] = {}
    for path in sorted(fresh):
        token, bucket = fresh[path]
        if token in gone:
            came.setdefault(token, []).append((path, bucket))
    pairs: list[tuple[str, str]] = []
    crossed = 0
    for token, arrivals in came.items():
        departures = gone[token]
        pairs += [(a, b) for (a, _), (b, _) in zip(departures, arrivals, strict=False)]
        crossed += buckets.crossings([b for _, b in departures], [b for _, b in arrivals])
    return sorted(pairs), crossed


def load_members(manifest: Manifest, **storage_options: Any) -> Iterator[ShardMembers]:
    """Every shard of ``manifest`` with its member list, read one shard at a time (of a
    set written before member lists: from its records, :func:`members.of_shard`).

    Raises:
        InputError: a member list that is missing, malformed, holds another
            number of records than its shard, or (where the manifest records
            one) does not match its ``records_sha256`` (:func:`members.load`).
    """
    fs, directory = storage.open_url(manifest.directory, **storage_options)
    for shard in manifest.shards:
        yield shard, members.of_shard(fs, directory, shard, manifest.compression)


# ----------------------------------------------------------------------------- helpers

_ABSENT: Any = object()


@dataclass
class _OldIndex:
    """The old version, per record: path -> (token, label name, bucket); None once matched."""

    old: dict[str, tuple[str, str, int | None] | None]
    counts: list[int]  # records per old label id


def _index_old(manifest: Manifest, shards: Iterable[ShardMembers], use_buckets: bool) -> _OldIndex:
    old: dict[str, tuple[str, str, int | None] | None] = {}
    counts = [0] * len(manifest.labels)
    names = manifest.labels
    for shard, rows in shards:
        bucket = shard.bucket if use_buckets else None
        for path, token, label in rows:
            if label >= len(names):
                raise _outside(manifest, label, path)
            counts[label] += 1
            if path in old:
                raise _twice(manifest, path)
            old[path] = (token, names[label], bucket)
    return _OldIndex(old, counts)


def _outside(manifest: Manifest, label: int, path: str) -> InputError:
    where = manifest.directory
    return InputError(
        f"{where}: {path}: label id {label} is outside the manifest's {len(manifest.labels)} "
        "labels",
        path=where,
    )


def _twice(manifest: Manifest, path: str) -> InputError:
    where = manifest.directory
    return InputError(f"{where}: {path} is listed twice in its member lists", path=where)


def _buckets_note(old: Manifest, new: Manifest) -> str:
    """Why the two versions' buckets cannot be compared; empty when they can."""
    for manifest, side in ((old, "old"), (new, "new")):
        if any(s.bucket is None for s in manifest.shards):
            return f"the {side} version has shards without a bucket"
    counts = old.params.get("buckets"), new.params.get("buckets")
    if counts[0] != counts[1]:
        return f"bucket counts differ: {counts[0]} old, {counts[1]} new"
    return ""


def _deltas(
    old_labels: Sequence[str],
    old_counts: list[int],
    new_labels: Sequence[str],
    new_counts: list[int],
) -> dict[str, int]:
    delta: dict[str, int] = {}
    for name, n in zip(new_labels, new_counts, strict=True):
        delta[name] = delta.get(name, 0) + n
    for name, n in zip(old_labels, old_counts, strict=True):
        delta[name] = delta.get(name, 0) - n
    return {name: n for name, n in sorted(delta.items()) if n}


def _named(manifest: Manifest) -> set[str]:
    return named_labels(manifest.labels, manifest.label_gaps)


def _emptied(
    old_labels: Sequence[str],
    old_counts: list[int],
    new_labels: Sequence[str],
    new_counts: list[int],
) -> tuple[str, ...]:
    had = {name for name, n in zip(old_labels, old_counts, strict=True) if n}
    empty = {name for name, n in zip(new_labels, new_counts, strict=True) if not n}
    return tuple(sorted(had & empty))


def _ids_changed(old: Sequence[str], new: Sequence[str]) -> dict[str, tuple[int, int]]:
    where = {name: i for i, name in enumerate(new)}
    return {
        name: (i, where[name])
        for i, name in sorted(enumerate(old), key=lambda x: x[1])
        if name in where and where[name] != i
    }
