"""The version a write grows from: found, checked, and matched against the new listing.

A write with a previous version (``--previous``; by default the manifest a
pipeline keeps at ``--manifest``) keeps its label ids and reuses each of its
shards whose records are all listed again unchanged (:mod:`.placement`). This
module reads that version's manifest and member lists
(:mod:`tfshards.shardset.members`) and says, for each of its shards, where
its records are in the new listing.
"""

from __future__ import annotations

import functools
import posixpath
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfshards import storage
from tfshards.errors import ConfigError, InputError
from tfshards.format import native
from tfshards.listing.protocol import FileListing
from tfshards.listing.storedlisting import plain_rows
from tfshards.shardset import layout, members
from tfshards.shardset import manifest as manifests
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest, ShardInfo

# Params that must match for a previous shard's bytes to be this write's: the
# others (the shard count, the label map) are settled record by record.
SAME_BYTES = ("compression", "exif", "image_feature", "name", "resize", "seed", "transform")
# Params that decide a record's bucket, hence its side of the split.
SAME_SPLIT = ("buckets", "group_by")

PreviousShards = list[tuple[int, "array[int]"]]  # per previous shard: bucket, listing index or -1


# DVC does not hold shards on an object store: only writing the version again brings it back.
_REMOTE_RESTORE = (
    "DVC holds no copy of shards on an object store (was it pruned from another clone?): put "
    "back the manifest of the commit before it (`git checkout REV -- dvc.lock`, then `dvc "
    "checkout` of this manifest) and run `dvc repro -f write`, which writes the same version "
    "again from the same files and params; or set write.previous: none (--previous none) to "
    "write every shard anew as a new lineage (records may change sides of the split); label "
    "ids are kept either way"
)
_RESTORE = (
    "restore it (dvc checkout --force, or dvc pull), or set write.previous: none (--previous none) "
    "to write every shard anew as a new lineage (records may change sides of the split); "
    "label ids are kept either way"
)


def last(manifest_copy: str | None) -> Manifest | None:
    """The manifest at ``manifest_copy`` (the pipeline's last version), its shards or not.

    What label ids are carried from, even when no shard is reused.
    """
    if manifest_copy is None:
        return None
    fs, path = storage.open_url(manifest_copy)
    try:
        data = storage.read_bytes(fs, path)
    except FileNotFoundError:
        return None
    return Manifest.from_json(data, source=manifest_copy)


def find(previous: str | None, manifest_copy: str | None, **options: Any) -> Manifest | None:
    """The version to grow from, or None to write every shard anew.

    ``previous``: ``"auto"`` (the manifest at ``manifest_copy``, when there is
    one), a manifest path or URL, or None.

    Raises:
        InputError: no manifest at an explicit ``previous``, or a manifest whose
            version directory is gone (one line saying how to restore it or start anew).
    """
    url = manifest_copy if previous == "auto" else previous
    if url is None or (previous == "auto" and last(url) is None):
        return None
    fs, path = storage.open_url(url, **options)
    try:
        manifest = Manifest.from_json(storage.read_bytes(fs, path), source=url)
    except FileNotFoundError:
        raise InputError(f"{url}: manifest not found", path=url) from None
    try:
        manifests.locate(manifest, fs, path, url)
    except InputError:
        where = storage.unstrip(fs, posixpath.dirname(posixpath.normpath(path)))
        raise InputError(
            f"{url}: the previous version {manifest.fingerprint} is missing (no folder "
            f"{manifest.root} in the manifest's folder {where} nor in one above it, up to "
            f"the project's top: pruned, deleted or not checked out); {_RESTORE}",
            path=url,
        ) from None
    found = manifests.load(url, **options)
    fs, directory = storage.open_url(found.directory, **options)
    if not fs.exists(storage.join(directory, MANIFEST_NAME)):
        raise InputError(
            f"{url}: the previous version {found.fingerprint} is missing (no manifest in "
            f"{found.directory}); {_RESTORE if storage.is_local(fs) else _REMOTE_RESTORE}",
            path=url,
        )
    return found


def damage(previous: Manifest, **options: Any) -> str:
    """What the previous version lacks (a shard missing or of another size), or "".

    One listing of its folder. A version with a shard gone (an interrupted
    upload, a hand) lends none: the writer repairs it when a fresh plan names it
    again, and otherwise stops where it would have lent shards
    (:func:`tfshards.writing.writer.write`).
    """
    found = storage.file_sizes(*storage.open_url(previous.directory, **options))
    for shard in previous.shards:
        size = found.get(shard.name)
        if size is None:
            return f"the previous version {previous.fingerprint} lacks shard {shard.name}"
        if size != shard.bytes:
            return (
                f"the previous version {previous.fingerprint} holds shard {shard.name} of "
                f"{size} bytes, not the {shard.bytes} its manifest lists"
            )
    return ""


def _as_param(value: Any) -> str:
    """A param's value as params.yaml spells it: ``none`` for no value, a resize by its
    size and an EXIF rule by its mode (the manifest keeps how, with which encoder), else
    its repr."""
    if value is None:
        return "none"
    if isinstance(value, Mapping) and ("size" in value or "mode" in value):
        return repr(value.get("size", value.get("mode")))
    return repr(value)


def split_change(before: Manifest, params: Mapping[str, Any]) -> str:
    """How a version written with ``params`` keys its split unlike ``before`` (the
    :data:`SAME_SPLIT` params that differ, ``"buckets 16 -> 32"``); "" when alike."""
    return ", ".join(_changed(before, params, SAME_SPLIT))


def _changed(before: Manifest, params: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    """``"key old -> new"`` for each of ``keys`` whose value ``params`` changes."""
    return [
        f"{key} {_as_param(before.params.get(key))} -> {_as_param(params.get(key))}"
        for key in keys
        if before.params.get(key) != params.get(key)
    ]


def growable(previous: Manifest, params: Mapping[str, Any]) -> str:
    """Why ``previous`` cannot lend its shards to a write with ``params``; "" when it can.

    Raises:
        ConfigError: records would hash into other buckets, so surviving records
            would change sides of the split (one line: what changed, what to do).
    """
    if "buckets" not in previous.params:
        return "the previous version was written before split buckets"
    before = previous.params["buckets"]
    if isinstance(before, int) and before < 2 and params.get("buckets") != before:
        # One bucket splits nothing: no record has a side to keep (its first version
        # had one file, or one shard).
        return f"the previous version has {before} split bucket, too few to split"
    for key in SAME_SPLIT:
        old, new = previous.params.get(key), params.get(key)
        if old != new:
            raise ConfigError(
                f"{key}: the previous version {previous.fingerprint} was written with "
                f"{key} {_as_param(old)}, this write has {_as_param(new)}: records would "
                "change sides of the "
                "train/validation split; keep it, or set write.previous: none (--previous "
                "none) for one write to start a new lineage (label ids are kept)",
                option=key,
                param=f"write.{key}",
            )
    if "columns" in params or "columns" in previous.params:
        # A member list names path, token and label: a kept shard could hold stale values.
        return "extra columns: a set with them is written anew"
    changed = _changed(previous, params, SAME_BYTES)
    if changed:  # each one named: a resize asked with exif was left unsaid
        verb = "differs" if len(changed) == 1 else "differ"
        return f"{'; '.join(changed)} {verb} from the previous version's"
    return ""


@dataclass(frozen=True)
class Match:
    """The previous version against the new listing, record by record.

    Attributes:
        held: per previous shard, its bucket and where each of its records is in
            the listing (-1: no longer listed as it was).
        found: per previous shard, where each record's path is listed now (-1: gone),
            whatever its content.
        added / removed / changed / relabeled / unchanged: record counts, by path:
            changed is another content token, relabeled another label name.
        moved_files: per content that left one path and arrived at another (a
            file moved or renamed: a label fixed by moving it to another folder, a
            folder renamed, also onto an existing name), the buckets it left and
            the listing indices where it arrived. Its key is its new path, so its
            bucket may change with it.
    """

    held: PreviousShards
    found: PreviousShards
    added: int
    removed: int
    changed: int
    relabeled: int
    unchanged: int
    moved_files: list[tuple[list[int], list[int]]] = field(default_factory=list)


def match(
    previous: Manifest,
    listing: FileListing,
    labels: Sequence[str],
    ids: Sequence[int],
    **options: Any,
) -> Match:
    """Where each record of ``previous`` is in ``listing``, and what became of it.

    A record is held when the listing has its path with the same content token,
    label name and label id (``labels``: the new map; ``ids``: the new id of
    each listing label). A shard whose records are all held is settled whole
    (:class:`_Listed`), record by record only otherwise.
    """
    fs, directory = storage.open_url(previous.directory, **options)
    old_names, new_names = previous.labels, tuple(labels)
    # The id a kept record must carry: its new id, when that id still names its label.
    keep = [new if new < len(old_names) and old_names[new] == new_names[new] else -1 for new in ids]
    side = _Listed(listing, keep)
    whole = side.held_in_c(fs, directory, previous.shards)
    held_all: PreviousShards = []
    found_all: PreviousShards = []
    counts = [0, 0, 0, 0]  # removed, changed, relabeled, unchanged
    claimed = np.zeros(listing.files, dtype=bool)  # lines a kept record stands for: each once
    gone: dict[Any, list[int]] = {}  # content that left its path -> the buckets it left
    arrived: list[int] = []  # changed records: content new at their path (listing indices)
    for k, shard in enumerate(previous.shards):
        bucket = shard.bucket if shard.bucket is not None else -1
        held = side.held(fs, directory, shard) if whole is None else whole[k]
        if held is not None and _claim(claimed, held):
            held_all.append((bucket, held))
            found_all.append((bucket, held))
            counts[3] += len(held)
            continue
        rows = side.read(fs, directory, shard)
        try:
            held, found = _classify(rows, side.lines, side.index, old_names, listing.labels, counts)
        except (TypeError, IndexError, ValueError):
            where = storage.unstrip(fs, layout.records_path(directory, shard.name))
            raise _bad_row(where, rows, len(old_names)) from None
        held_all.append((bucket, held))
        found_all.append((bucket, found))
        at = np.frombuffer(found, dtype=np.int32)
        claimed[at[at >= 0]] = True
        for row, i in zip(rows, at.tolist(), strict=True):
            if i < 0 or side.lines[i][2] != row[1]:  # removed, or its path holds new bytes
                gone.setdefault(row[1], []).append(bucket)
                arrived += [i] if i >= 0 else []
    removed, changed, relabeled, unchanged = counts
    added = listing.files - int(claimed.sum())
    moved = _moved_files(side.lines, claimed, arrived, gone) if gone else []
    return Match(held_all, found_all, added, removed, changed, relabeled, unchanged, moved)


def _moved_files(
    lines: Sequence[tuple[Any, Any, Any]],
    claimed: Any,
    arrived: list[int],
    gone: dict[Any, list[int]],
) -> list[tuple[list[int], list[int]]]:
    """Per content that left a path (removed, or its path holds other bytes now) and is
    new at another (added, or a changed path's): the buckets it left and the listing
    indices where it arrived. A file moved or renamed, onto an existing name too."""
    at: dict[Any, list[int]] = {}
    for i in [*np.flatnonzero(~claimed).tolist(), *arrived]:
        token = lines[i][2]
        if token in gone:
            at.setdefault(token, []).append(i)
    return [(gone[token], indices) for token, indices in at.items()]


class _Listed:
    """The new listing as :func:`match` compares it with the previous member lists.

    Bytes against bytes where the listing is stored plain (paths and tokens
    compared as their JSON string bytes: both files are written by ``json``
    with ``ensure_ascii=False``), decoded strings otherwise. Each view is
    built on first use, so an append whose shards are all held in C builds
    none: 20,200 listed files against 64 member lists took 11-15 ms there,
    against ~60 ms for the regex pass and dict of member lines in Python.
    """

    def __init__(self, listing: FileListing, keep: list[int]) -> None:
        self.listing, self.keep = listing, keep
        self.text = listing.jsonl()

    def held_in_c(self, fs: Any, directory: str, shards: Sequence[ShardInfo]) -> list[Any] | None:
        """Per shard, its records' listing indices when all are held, else None; found in
        C (``tfshards.format._native``). None without the C loops or a plain listing."""
        c = native.NATIVE
        if c is None or self.text is None:
            return None
        keep = [str(k).encode() for k in self.keep]
        data = [members.read(fs, directory, shard) for shard in shards]
        found = c.match_members(self.text, self.listing.files, keep, data)
        if found is None:
            return None
        return [
            None if at is None else _held_bytes(at, shard)
            for at, shard in zip(found, shards, strict=True)
        ]

    def held(self, fs: Any, directory: str, shard: ShardInfo) -> array[int] | None:
        """``shard``'s records' listing indices when all are held, else None (Python)."""
        if self.raw is not None:
            return _held(list(map(self.by_line.get, members.lines(fs, directory, shard))), shard)
        rows = _decoded(fs, directory, shard)
        paths = [row[0] for row in rows]
        intact = list(map(self.expected.get, paths)) == rows
        return array("i", map(self.index.__getitem__, paths)) if intact else None

    def read(self, fs: Any, directory: str, shard: ShardInfo) -> Sequence[tuple[Any, Any, Any]]:
        """``shard``'s member rows, comparable with :attr:`lines`."""
        if self.raw is not None:
            return members.raw_rows(fs, directory, shard)
        return _decoded(fs, directory, shard)

    @functools.cached_property
    def raw(self) -> list[tuple[bytes, bytes, bytes]] | None:
        """Each line's label id, path and token as JSON bytes, when every line is plain."""
        if self.text is None:
            return None
        return plain_rows(self.text, self.listing.files, len(self.listing.labels))

    @functools.cached_property
    def lines(self) -> Sequence[tuple[Any, Any, Any]]:
        """Each listed file's ``(label id, path, token)``: bytes or decoded."""
        if self.raw is not None:
            return self.raw
        return [(label, path, token) for path, token, label in self.listing.scan()]

    @functools.cached_property
    def index(self) -> dict[Any, int]:
        """Each listed path's line number (36 ms for 20,000 files)."""
        return {path: i for i, (_, path, _) in enumerate(self.lines)}

    @functools.cached_property
    def by_line(self) -> dict[bytes, int]:
        """Each listed file's member line as the writer would encode it
        (:func:`tfshards.shardset.members.encode`) -> its line number."""
        assert self.raw is not None
        want = {str(li).encode(): str(k).encode() for li, k in enumerate(self.keep)}
        return {b'["%b","%b",%b]' % (p, t, want[li]): i for i, (li, p, t) in enumerate(self.raw)}

    @functools.cached_property
    def expected(self) -> dict[Any, tuple[Any, Any, Any]]:
        """Each listed path -> the member row a held record has."""
        want = dict(enumerate(self.keep))
        return {path: (path, token, want[li]) for li, path, token in self.lines}


def changes(
    found: Match,
    previous: Manifest,
    labels: Sequence[str],
    moved: tuple[int, int],
    gaps: Sequence[int] = (),
) -> dict[str, int]:
    """The counts the manifest keeps under ``changes`` (``diff.Changes.to_metrics``), as the
    member lists match; the writer takes the files it leaves out off them. ``moved``:
    records in another bucket by path, and files moved or renamed into another bucket
    (``moved_files``, kept only when there are any: older manifests keep their bytes).
    A label map's gaps (ids no folder names: ``gaps`` of ``labels``, and the previous
    version's :attr:`Manifest.label_gaps`) are no label to add or remove."""
    old, new = previous.labels, tuple(labels)
    position = {name: i for i, name in enumerate(new)}
    by_path, files = moved
    real_old = manifests.named_labels(old, previous.label_gaps)
    real_new = manifests.named_labels(new, gaps)
    return {
        "added": found.added,
        "changed": found.changed,
        "ids_changed": sum(position.get(name, i) != i for i, name in enumerate(old)),
        "labels_added": len(real_new - real_old),
        "labels_removed": len(real_old - real_new),
        "moved_buckets": by_path,
        **({"moved_files": files} if files else {}),
        "relabeled": found.relabeled,
        "removed": found.removed,
        "unchanged": found.unchanged,
    }


def _held(at: list[int | None], shard: ShardInfo) -> array[int] | None:
    """The listing indices of a shard's lines, when every line is expected; else None."""
    if None in at or len(at) != shard.records:
        return None
    return array("i", at)  # type: ignore[arg-type]


def _claim(claimed: np.ndarray, held: array[int]) -> bool:
    """Claim the listing lines of a shard kept whole; False (nothing claimed) when one is
    claimed already: a member list that holds a record twice, or one another list holds
    (edited by hand), is written again, so no version holds a listed file twice."""
    at = np.frombuffer(held, dtype=np.int32)
    if claimed[at].any() or len(np.unique(at)) != len(at):
        return False
    claimed[at] = True
    return True


def _bad_row(where: str, rows: Sequence[tuple[Any, Any, Any]], labels: int) -> InputError:
    """The error for a member list :func:`_classify` could not read: its first label id
    that is not below ``labels`` (the previous version's), by line."""
    for n, (_, _, label) in enumerate(rows, 1):
        text = label.decode() if isinstance(label, bytes) else str(label)
        try:
            ok = 0 <= int(text) < labels
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return InputError(
                f"{where}:{n}: expected a label id below {labels}, found {text}",
                path=where,
                line=n,
            )
    return InputError(
        f"{where}: expected rows [path, token, label id] with label ids below {labels}, "
        "found another row",
        path=where,
    )


def _held_bytes(at: bytes, shard: ShardInfo) -> array[int] | None:
    """The int32 listing indices C found for a shard's lines, when there is one per record."""
    held = array("i")
    held.frombytes(at)
    return held if len(held) == shard.records else None


def _decoded(fs: Any, directory: str, shard: ShardInfo) -> list[tuple[Any, Any, Any]]:
    return [(row[0], row[1], row[2]) for row in members.load(fs, directory, shard)]


def _classify(
    rows: Sequence[tuple[Any, Any, Any]],
    lines: Sequence[tuple[Any, Any, Any]],
    index: dict[Any, int],
    old_names: Sequence[str],
    listed_names: Sequence[str],
    counts: list[int],
) -> tuple[array[int], array[int]]:
    """A shard that lost a record: each record held or not, counted as removed,
    changed, relabeled or unchanged (``counts``, in that order)."""
    held, found = array("i"), array("i")
    for path, token, label in rows:
        i = index.get(path, -1)
        found.append(i)
        if i < 0:
            counts[0] += 1
            held.append(-1)
            continue
        listed_label, _, listed_token = lines[i]
        if listed_token != token:
            counts[1] += 1
        elif listed_names[int(listed_label)] != old_names[int(label)]:
            counts[2] += 1
        else:
            counts[3] += 1
        held.append(-1)  # a shard that lost a record is written again whole
    return held, found
