"""The version a write grows from: found, checked, and matched against the new listing.

A write with a previous version (``--previous``; by default the manifest a
pipeline keeps at ``--manifest``) keeps its label ids and reuses each of its
shards whose records are all listed again unchanged (:mod:`.placement`). This
module reads that version's manifest and member lists
(:mod:`tfshards.shardset.members`) and says, for each of its shards, where
its records are in the new listing.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import storage
from tfshards.errors import ConfigError, InputError
from tfshards.listing.protocol import FileListing
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


_RESTORE = (
    "restore it (dvc checkout, or dvc pull), or set write.previous: none (--previous none) "
    "to write every shard anew; label ids are kept either way"
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
        raise InputError(
            f"{url}: the previous version {manifest.fingerprint} is missing (its folder "
            f"{manifest.root} is not there); {_RESTORE}",
            path=url,
        ) from None
    found = manifests.load(url, **options)
    fs, directory = storage.open_url(found.directory, **options)
    if not fs.exists(storage.join(directory, MANIFEST_NAME)):
        raise InputError(
            f"{url}: the previous version {found.fingerprint} is missing (no manifest in "
            f"{found.directory}); {_RESTORE}",
            path=url,
        )
    return found


def damage(previous: Manifest, **options: Any) -> str:
    """What the previous version lacks (a shard missing or of another size), or "".

    One listing of its folder. A version with a shard gone (an interrupted
    upload, a hand) lends none: the write plans anew, and resumes that version
    itself when the plan names it again.
    """
    found = storage.file_sizes(*storage.open_url(previous.directory, **options))
    for shard in previous.shards:
        if found.get(shard.name) != shard.bytes:
            return f"the previous version {previous.fingerprint} lacks shard {shard.name} as listed"
    return ""


def growable(previous: Manifest, params: Mapping[str, Any]) -> str:
    """Why ``previous`` cannot lend its shards to a write with ``params``; "" when it can.

    Raises:
        ConfigError: records would hash into other buckets, so surviving records
            would change sides of the split (one line: what changed, what to do).
    """
    if "buckets" not in previous.params:
        return "the previous version was written before split buckets"
    for key in SAME_SPLIT:
        old, new = previous.params.get(key), params.get(key)
        if old != new:
            raise ConfigError(
                f"{key}: the previous version {previous.fingerprint} was written with "
                f"{key} {old!r}, this write has {new!r}: records would change sides of the "
                "train/validation split; keep it, or set write.previous: none (--previous "
                "none) for one write to start a new lineage (label ids are kept)",
                option=key,
                param=f"write.{key}",
            )
    if "columns" in params or "columns" in previous.params:
        # A member list names path, token and label: a kept shard could hold stale values.
        return "extra columns: a set with them is written anew"
    for key in SAME_BYTES:
        old, new = previous.params.get(key), params.get(key)
        if old != new:
            return f"{key} differs from the previous version's ({old!r} -> {new!r})"
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
    """

    held: PreviousShards
    found: PreviousShards
    added: int
    removed: int
    changed: int
    relabeled: int
    unchanged: int


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
    each listing label). Paths and tokens are compared as the bytes of their
    JSON strings where both files allow it (no JSON decoded: 20,000 files
    matched in about 40 ms), else as decoded strings. Holds each listed path,
    token and label in one dict (about 200 bytes a file); a shard whose
    records are all held is settled by comprehensions, record by record
    only otherwise.
    """
    fs, directory = storage.open_url(previous.directory, **options)
    old_names, new_names = previous.labels, tuple(labels)
    # The id a kept record must carry: its new id, when that id still names its label.
    keep = [new if new < len(old_names) and old_names[new] == new_names[new] else -1 for new in ids]
    raw = listing.raw_rows()  # bytes against bytes: no JSON decoded on either side
    if raw is not None:
        read: Callable[..., Sequence[tuple[Any, Any, Any]]] = members.raw_rows
        want: dict[Any, Any] = {str(li).encode(): str(k).encode() for li, k in enumerate(keep)}
        lines: Sequence[tuple[Any, Any, Any]] = raw
    else:
        read = _decoded
        want = dict(enumerate(keep))
        lines = [(label, path, token) for path, token, label in listing.scan()]
    expected = {}
    if raw is not None:  # each member line as the writer would encode it (members.encode)
        by_line = {b'["%b","%b",%b]' % (p, t, want[li]): i for i, (li, p, t) in enumerate(raw)}
    else:
        expected = {path: (path, token, want[li]) for li, path, token in lines}
    # Each listed path's position: needed at once without raw lines, else only for a
    # shard not held whole (36 ms for 20,000 files that an append does not spend).
    index = {} if raw is not None else _positions(lines)
    held_all: PreviousShards = []
    found_all: PreviousShards = []
    counts = [0, 0, 0, 0]  # removed, changed, relabeled, unchanged
    survivors = 0
    for shard in previous.shards:
        bucket = shard.bucket if shard.bucket is not None else -1
        if raw is not None:  # the common case, in C: every line is one the listing expects
            held = _held(list(map(by_line.get, members.lines(fs, directory, shard))), shard)
        else:
            rows = read(fs, directory, shard)
            paths = [row[0] for row in rows]
            intact = list(map(expected.get, paths)) == rows
            held = array("i", map(index.__getitem__, paths)) if intact else None
        if held is not None:
            held_all.append((bucket, held))
            found_all.append((bucket, held))
            counts[3] += len(held)
            survivors += len(held)
            continue
        try:
            rows = read(fs, directory, shard)
            index = index or _positions(lines)
            held, found = _classify(rows, lines, index, old_names, listing.labels, counts)
        except (TypeError, IndexError, ValueError):
            where = storage.unstrip(fs, layout.records_path(directory, shard.name))
            raise InputError(
                f"{where}: expected rows [path, token, label id] with label ids below "
                f"{len(old_names)}, found another row",
                path=where,
            ) from None
        held_all.append((bucket, held))
        found_all.append((bucket, found))
        survivors += sum(i >= 0 for i in found)
    removed, changed, relabeled, unchanged = counts
    added = listing.files - survivors
    return Match(held_all, found_all, added, removed, changed, relabeled, unchanged)


def changes(found: Match, previous: Manifest, labels: Sequence[str], moved: int) -> dict[str, int]:
    """The counts the manifest keeps under ``changes`` (``diff.Changes.to_metrics``)."""
    old, new = previous.labels, tuple(labels)
    position = {name: i for i, name in enumerate(new)}
    return {
        "added": found.added,
        "changed": found.changed,
        "ids_changed": sum(position.get(name, i) != i for i, name in enumerate(old)),
        "labels_added": len(set(new) - set(old)),
        "labels_removed": len(set(old) - set(new)),
        "moved_buckets": moved,
        "relabeled": found.relabeled,
        "removed": found.removed,
        "unchanged": found.unchanged,
    }


def _positions(lines: Sequence[tuple[Any, Any, Any]]) -> dict[Any, int]:
    """Each listed path -> its line number."""
    return {path: i for i, (_, path, _) in enumerate(lines)}


def _held(at: list[int | None], shard: ShardInfo) -> array[int] | None:
    """The listing indices of a shard's lines, when every line is expected; else None."""
    if None in at or len(at) != shard.records:
        return None
    return array("i", at)  # type: ignore[arg-type]


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
