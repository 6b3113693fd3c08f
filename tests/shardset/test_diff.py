"""``tfshards.shardset.diff``: two hand-built versions compared from manifests and member lists."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from tfshards.errors import InputError
from tfshards.shardset import layout, members
from tfshards.shardset.diff import Changes, compare, load_members
from tfshards.shardset.manifest import Manifest, ShardInfo, load

Row = tuple[str, str, int]


def write_version(
    parent: Path,
    fingerprint: str,
    labels: Sequence[str],
    shards: Sequence[tuple[int | None, Sequence[Row]]],
    buckets: int | None = 4,
    with_sha: bool = True,
) -> Path:
    """A version directory: manifest.json, a member list per shard, dummy shard bytes.

    ``shards``: each shard's bucket and rows ``(path, token, label id)``. Returns the manifest.
    """
    directory = parent / fingerprint
    (directory / layout.RECORDS.folder).mkdir(parents=True)
    infos = []
    for index, (bucket, rows) in enumerate(shards):
        name = layout.shard_name("data", index, len(shards))
        (directory / name).write_bytes(b"not a shard")
        data = members.encode(rows)
        Path(layout.records_path(str(directory), name)).write_bytes(data)
        sha = hashlib.sha256(data).hexdigest() if with_sha else None
        infos.append(ShardInfo(name, len(rows), 11, "0" * 64, None, bucket, sha))
    params: dict[str, object] = {"name": "data"}
    if buckets is not None:
        params["buckets"] = buckets
    manifest = Manifest(
        root=str(directory),
        fingerprint=fingerprint,
        params=params,
        schema=(),
        labels=tuple(labels),
        compression="none",
        shards=tuple(infos),
        listed=sum(len(rows) for _, rows in shards),
    )
    path = directory / layout.MANIFEST_NAME
    path.write_bytes(manifest.to_json())
    return path


def tok(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


OLD_LABELS = ("cat", "dog")
OLD = [
    (0, [("cat/1.jpg", tok("c1"), 0), ("cat/2.jpg", tok("c2"), 0), ("dog/3.jpg", tok("d3"), 1)]),
    (1, [("dog/4.jpg", tok("d4"), 1), ("dog/5.jpg", tok("d5"), 1), ("cat/6.jpg", tok("c6"), 0)]),
]
# cat/2 removed, dog/5 changed, cat/6 relabeled to dog, new/7 added (bird); "bird" sorts
# first, so cat and dog get new ids.
NEW_LABELS = ("bird", "cat", "dog")
NEW = [
    (0, [("cat/1.jpg", tok("c1"), 1), ("dog/3.jpg", tok("d3"), 2), ("new/7.jpg", tok("b7"), 0)]),
    (1, [("dog/4.jpg", tok("d4"), 2), ("dog/5.jpg", tok("d5 v2"), 2), ("cat/6.jpg", tok("c6"), 2)]),
]


def diff(old: Path, new: Path) -> Changes:
    a, b = load(str(old)), load(str(new))
    return compare(a, b, load_members(a), load_members(b))


def test_records_are_matched_by_path_and_labels_by_name(tmp_path: Path) -> None:
    old = write_version(tmp_path, "0" * 16, OLD_LABELS, OLD)
    new = write_version(tmp_path, "1" * 16, NEW_LABELS, NEW)
    changes = diff(old, new)
    assert (changes.added, changes.removed, changes.changed, changes.relabeled) == (1, 1, 1, 1)
    assert changes.unchanged == 3  # cat/1, dog/3, dog/4: the same name under another id
    assert changes.added_paths == ("new/7.jpg",)
    assert changes.removed_paths == ("cat/2.jpg",)
    assert changes.changed_paths == ("dog/5.jpg",)
    assert changes.relabeled_paths == ("cat/6.jpg",)
    assert changes.label_deltas == {"bird": 1, "cat": -2, "dog": 1}
    assert changes.labels_added == ("bird",)
    assert changes.labels_removed == ()
    assert changes.ids_changed == {"cat": (0, 1), "dog": (1, 2)}
    assert changes.moved_buckets == 0
    assert changes.to_metrics() == {
        "added": 1,
        "removed": 1,
        "changed": 1,
        "relabeled": 1,
        "unchanged": 3,
        "labels_added": 1,
        "labels_removed": 0,
        "labels_emptied": 0,
        "ids_changed": 2,
        "moved_paths": 0,
        "moved_files": 0,
        "moved_buckets": 0,
    }
    assert changes.lines() == [
        "records: 1 added, 1 removed, 1 changed, 1 relabeled, 3 unchanged",
        "records per label: bird +1, cat -2, dog +1",
        "labels added: bird",
        "label ids changed: cat 0->1, dog 1->2",
        "buckets: 0 records under the same path moved to another bucket",
    ]


def test_the_same_version_has_no_changes(tmp_path: Path) -> None:
    old = write_version(tmp_path, "0" * 16, OLD_LABELS, OLD)
    changes = diff(old, old)
    assert changes == Changes(
        added=0, removed=0, changed=0, relabeled=0, unchanged=6, moved_buckets=0
    )


def test_a_removed_label_and_records_in_another_bucket(tmp_path: Path) -> None:
    old = write_version(tmp_path, "0" * 16, OLD_LABELS, OLD)
    # dog only: every cat is gone, and dog/4 and dog/5 sit in bucket 0 now.
    rows = [("dog/3.jpg", tok("d3"), 0), ("dog/4.jpg", tok("d4"), 0), ("dog/5.jpg", tok("d5"), 0)]
    new = write_version(tmp_path, "1" * 16, ("dog",), [(0, rows)])
    changes = diff(old, new)
    assert changes.removed_paths == ("cat/1.jpg", "cat/2.jpg", "cat/6.jpg")
    assert changes.labels_removed == ("cat",)
    assert changes.ids_changed == {"dog": (1, 0)}
    assert changes.label_deltas == {"cat": -3}
    assert changes.moved_buckets == 2
    assert changes.to_metrics()["moved_buckets"] == 2


def test_buckets_are_not_comparable_without_buckets_or_at_another_count(tmp_path: Path) -> None:
    old = write_version(tmp_path, "0" * 16, OLD_LABELS, OLD)
    unbucketed = write_version(
        tmp_path, "1" * 16, OLD_LABELS, [(None, rows) for _, rows in OLD], buckets=None
    )
    changes = diff(old, unbucketed)
    assert changes.moved_buckets is None
    metrics = changes.to_metrics()  # the same keys: null where nothing could be compared
    assert (metrics["moved_buckets"], metrics["moved_files"]) == (None, None)
    assert changes.lines()[-1] == (
        "buckets: not comparable (the new version has shards without a bucket)"
    )
    assert changes.unchanged == 6
    eight = write_version(tmp_path, "2" * 16, OLD_LABELS, OLD, buckets=8)
    assert diff(old, eight).buckets_note == "bucket counts differ: 4 old, 8 new"


def test_member_lists_are_checked_against_the_manifest(tmp_path: Path) -> None:
    path = write_version(tmp_path, "0" * 16, OLD_LABELS, OLD)
    manifest = load(str(path))
    member_list = Path(layout.records_path(manifest.directory, manifest.shards[1].name))
    member_list.write_bytes(members.encode(OLD[1][1][:2]))
    with pytest.raises(InputError, match=r"records_sha256\), found [0-9a-f]{64}$"):
        list(load_members(manifest))
    unhashed = write_version(tmp_path, "1" * 16, OLD_LABELS, OLD, with_sha=False)
    manifest = load(str(unhashed))
    member_list = Path(layout.records_path(manifest.directory, manifest.shards[1].name))
    member_list.write_bytes(members.encode(OLD[1][1][:2]))
    with pytest.raises(InputError, match=r"expected 3 members \(the manifest's records\), found 2"):
        list(load_members(manifest))
    member_list.write_bytes(b'["a.jpg","sha256:00",0]\n["b.jpg","sha256:00"]\n["c",""]\n')
    with pytest.raises(InputError, match=r"data-00001-of-00002.tfrecord.jsonl: line 2: expected"):
        list(load_members(manifest))
    member_list.write_bytes(b'["a.jpg","t",0],["b.jpg","t",0]\n["c.jpg","t",0]\n')  # 3 rows
    with pytest.raises(InputError, match=r"tfrecord.jsonl: line 1: expected \[path, token"):
        list(load_members(manifest))
    member_list.unlink()  # no records_sha256, no list: read from the shard (dummy bytes here)
    shard = Path(manifest.directory) / manifest.shards[1].name
    with pytest.raises(InputError, match=rf"^{shard}: record 0: truncated header"):
        list(load_members(manifest))
    manifest = load(str(path))  # its manifest records the list's sha256: the list is missing
    member_list = Path(layout.records_path(manifest.directory, manifest.shards[1].name))
    member_list.unlink()
    with pytest.raises(InputError) as caught:
        list(load_members(manifest))
    assert str(caught.value).startswith(f"{member_list}: member list not found")


def test_a_label_id_outside_the_labels_and_a_repeated_path_are_errors(tmp_path: Path) -> None:
    shards = [(0, [("a.jpg", tok("a"), 0), ("b.jpg", tok("b"), 2)])]
    bad_label = load(str(write_version(tmp_path, "0" * 16, OLD_LABELS, shards)))
    good = load(str(write_version(tmp_path, "1" * 16, OLD_LABELS, OLD)))
    with pytest.raises(InputError, match=r"b\.jpg: label id 2 is outside the manifest's 2 labels"):
        compare(good, bad_label, load_members(good), load_members(bad_label))
    twice = [(0, [("a.jpg", tok("a"), 0)]), (1, [("a.jpg", tok("a"), 0)])]
    repeated = load(str(write_version(tmp_path, "2" * 16, OLD_LABELS, twice)))
    for old, new in ((repeated, good), (good, repeated)):
        with pytest.raises(InputError, match=r"a\.jpg is listed twice in its member lists"):
            compare(old, new, load_members(old), load_members(new))


def test_members_compare_from_any_iterable_of_rows(tmp_path: Path) -> None:
    """compare reads no file: Members from anywhere compare as the parsed lists do."""
    old_path = write_version(tmp_path, "0" * 16, OLD_LABELS, OLD)
    new_path = write_version(tmp_path, "1" * 16, NEW_LABELS, NEW)
    old, new = load(str(old_path)), load(str(new_path))
    rows = [members.Member(*row) for _, shard in OLD for row in shard]
    in_memory = [(old.shards[0], rows[:3]), (old.shards[1], rows[3:])]
    assert compare(old, new, in_memory, load_members(new)) == diff(old_path, new_path)


def _without_member_lists(manifest: Manifest) -> Manifest:
    """``manifest``'s version as a writer before member lists left it: no ``records/``
    folder, no ``records_sha256`` in the manifest (saved in place)."""
    import dataclasses
    import shutil

    directory = Path(manifest.directory)
    shutil.rmtree(directory / layout.RECORDS.folder)
    shards = tuple(dataclasses.replace(s, records_sha256=None) for s in manifest.shards)
    old = dataclasses.replace(manifest, shards=shards)
    (directory / layout.MANIFEST_NAME).write_bytes(old.to_json())
    return load(str(directory / layout.MANIFEST_NAME))


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_set_written_before_member_lists_is_compared_from_its_records(
    make_raw, write_set, tmp_path: Path, compression: str
) -> None:
    """Sets written before member lists have none: diff, show and lookups failed on every
    one of them with "member list not found"."""
    from tfshards.reading.lookup import Version

    raw = make_raw(12, 8, classes=2)
    gzip = {"compression": compression} if compression != "none" else {}
    written = write_set(raw, tmp_path / "a", num_shards=3, **gzip)
    rows = {s.name: members.load(*_local(written), s) for s in written.shards}
    new = write_set(raw, tmp_path / "b", num_shards=3, **gzip)
    old = _without_member_lists(written)
    fs, directory = _local(old)
    found = {s.name: members.of_shard(fs, directory, s, compression) for s in old.shards}
    assert {k: [tuple(r) for r in v] for k, v in found.items()} == {
        k: [tuple(r) for r in v] for k, v in rows.items()
    }
    changes = compare(old, new, load_members(old), load_members(new))
    assert (changes.added, changes.removed, changes.unchanged) == (0, 0, new.records)
    path = rows[old.shards[0].name][0][0]
    assert Version(old).find(path).path == path


def _local(manifest: Manifest) -> tuple[object, str]:
    from tfshards import storage

    return storage.open_url(manifest.directory)
