"""Data that grows: a version written from a previous one reuses its unchanged shards,
keeps every surviving record on its side of the split and its label id, and says what
changed; no reader ever serves a removed record."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import shutil
import warnings
from array import array
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from handedits import edit_listing_line, edit_member_rows
from tfshards.cli import app
from tfshards.errors import ChangedSinceListingError, ConfigError, InputError, ShardError
from tfshards.format import native
from tfshards.listing.listing import list_files, write_listing
from tfshards.listing.storedlisting import open_stored
from tfshards.shardset import buckets, diff, layout
from tfshards.shardset.manifest import Manifest
from tfshards.shardset.split import SplitWarning, split
from tfshards.validation.config import ValidateConfig
from tfshards.validation.validate import validate
from tfshards.writing import growth
from tfshards.writing.config import WriteConfig
from tfshards.writing.plan import _rejected_again
from tfshards.writing.shard import _Rejects
from tfshards.writing.writer import WriteResult, write

FILES = 2000


@pytest.fixture
def raw(make_raw) -> Path:
    return make_raw(FILES, 8, fmt="png", classes=10)


def _grow(raw: Path, out: Path, **kw) -> WriteResult:
    config = WriteConfig(
        out=str(out / "shards"), manifest_copy=str(out / "manifest.json"), executor="serial", **kw
    )
    return write(config, list_files(str(raw)), progress=False)


def _add(raw: Path, count: int, seed: int = 1) -> list[str]:
    """Copies of ``count`` existing files under new names, in their label folders."""
    files = sorted(p for p in raw.rglob("*.png"))
    added = []
    for p in random.Random(seed).sample(files, count):
        new = p.with_name(f"new{seed}_{p.name}")
        shutil.copyfile(p, new)
        added.append(str(new.relative_to(raw)))
    return added


def _members(m: Manifest) -> dict[str, tuple[str, int]]:
    """path -> (shard name, label id), from the member lists."""
    return {row[0]: (shard.name, row[2]) for shard, rows in diff.load_members(m) for row in rows}


def _compared(old: Manifest, new: Manifest) -> dict[str, int]:
    """What ``tfshards diff`` finds from the member lists: the writer's counts must agree.

    The manifest keeps no ``moved_paths`` or ``labels_emptied``, and ``moved_files`` only
    when there are any."""
    found = diff.compare(old, new, diff.load_members(old), diff.load_members(new)).to_metrics()
    del found["moved_paths"], found["labels_emptied"]
    if not found["moved_files"]:
        del found["moved_files"]
    return found


def _inodes(m: Manifest) -> dict[int, str]:
    return {os.stat(Path(m.directory) / s.name).st_ino: s.name for s in m.shards}


def test_an_append_of_one_percent_reuses_every_shard_as_the_same_inode(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=32).manifest
    added = _add(raw, FILES // 100)
    grown = _grow(raw, tmp_path, num_shards=32)
    second = grown.manifest
    assert second.base == first.fingerprint != second.fingerprint
    old = _inodes(first)
    kept = [ino for ino in _inodes(second) if ino in old]
    assert len(kept) / len(first.shards) >= 0.95 and grown.reused == len(kept)
    where = _members(second)
    assert set(where) == {*_members(first), *added}
    new_shards = {where[p][0] for p in added}
    assert not new_shards & {old[ino] for ino in kept}  # added records went to new shards
    for ino in kept:  # a kept shard's companions are the old files too, not rewrites
        name = _inodes(second)[ino]
        for companion in (layout.RECORDS, layout.STATS):
            here = os.stat(Path(second.directory) / companion.path(name)).st_ino
            assert here == os.stat(Path(first.directory) / companion.path(old[ino])).st_ino
    assert second.changes["added"] == len(added) and second.changes["moved_buckets"] == 0
    assert validate(ValidateConfig(str(tmp_path / "manifest.json"))).ok
    again = _grow(raw, tmp_path, num_shards=32)  # nothing new: the same version
    assert again.manifest == second and again.reused == len(second.shards)


def test_five_changed_files_rewrite_at_most_five_previous_shards(raw, tmp_path):
    _grow(raw, tmp_path, num_shards=32)
    _add(raw, FILES // 100)  # an append first: its small delta shards stay put below
    first = _grow(raw, tmp_path, num_shards=32).manifest
    changed = sorted(raw.rglob("*.png"))[::400][:5]
    for p in changed:
        p.write_bytes(sorted(raw.rglob("*.png"))[-1].read_bytes())  # other valid content
    second = _grow(raw, tmp_path, num_shards=32).manifest
    old = {s.sha256 for s in first.shards}
    rewritten = len(first.shards) - sum(s.sha256 in old for s in second.shards)
    assert rewritten <= 5
    assert second.changes["changed"] == 5 and second.changes["added"] == 0
    assert second.changes == _compared(first, second)


def test_removed_files_are_served_by_no_reader(raw, tmp_path):
    import tensorflow as tf

    from tfshards.reading.loader import make_dataset

    first = _grow(raw, tmp_path, num_shards=32).manifest
    files = sorted(raw.rglob("*.png"))
    gone = random.Random(3).sample(files, 10)  # 0.5%, spread over the shards
    for p in gone:
        p.unlink()
    second = _grow(raw, tmp_path, num_shards=32).manifest
    removed = {str(p.relative_to(raw)) for p in gone}
    assert second.changes["removed"] == 10 and not removed & set(_members(second))
    assert second.changes == _compared(first, second)
    read = set()
    ds = make_dataset(
        second.shards, second, batch_size=256, training=False, decode=False, features=["path"]
    )
    for batch, _ in ds:
        read.update(p.decode() for p in batch["path"].numpy())
    assert len(read) == FILES - 10 and not read & removed
    pattern = f"{second.directory}/{second.params['name']}-*"  # as an outside reader globs
    outside = tf.data.TFRecordDataset(tf.io.gfile.glob(pattern))
    desc = {"path": tf.io.FixedLenFeature([], tf.string)}
    paths = {tf.io.parse_single_example(r, desc)["path"].numpy().decode() for r in outside}
    assert len(paths) == FILES - 10 and not paths & removed
    assert validate(ValidateConfig(str(tmp_path / "manifest.json"))).ok


def test_no_surviving_record_changes_side_and_new_ones_reach_val_at_the_fraction(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=32).manifest
    for p in random.Random(5).sample(sorted(raw.rglob("*.png")), 100):
        p.unlink()
    added = _add(raw, 1000, seed=2)
    second = _grow(raw, tmp_path, num_shards=32).manifest

    def sides(m: Manifest) -> dict[str, str]:
        part = split(m, 0.2, seed=7)
        val = {s.name for s in part.val}
        return {
            path: "val" if shard in val else "train" for path, (shard, _) in _members(m).items()
        }

    before, after = sides(first), sides(second)
    survivors = before.keys() & after.keys()
    assert len(survivors) == FILES - 100
    assert [p for p in survivors if before[p] != after[p]] == []
    effective = split(second, 0.2, seed=7).effective_val_fraction
    share = sum(after[p] == "val" for p in added) / len(added)
    sigma = math.sqrt(effective * (1 - effective) / len(added))
    assert abs(share - effective) <= 3 * sigma  # the stated tolerance: 3 standard errors
    assert abs(effective - 0.2) <= 0.2 * 0.1 + 3 * sigma


def test_groups_stay_whole_when_a_group_grows(raw, tmp_path):
    group_by = r"^(\d+/(?:new\d+_)?\d{4})"  # <= 10 files a group
    first = _grow(raw, tmp_path, num_shards=16, group_by=group_by).manifest
    added = _add(raw, 20)  # "new1_..." names: groups of their own
    for p in sorted(raw.rglob("0*/00*.png"))[:3]:  # and records joining existing groups
        shutil.copyfile(p, p.with_name(p.name.replace(".png", "9.png")))
    second = _grow(raw, tmp_path, num_shards=16, group_by=group_by).manifest
    assert second.base == first.fingerprint and added
    report = validate(ValidateConfig(str(tmp_path / "manifest.json")))
    assert report.ok and report.groups is not None and report.groups.spanning == 0
    # every count every time (the manifest keeps moved_files only when there are any)
    assert "moved_files" not in second.changes
    assert report.metrics()["growth"] == {"moved_files": 0, **second.changes}


def test_a_new_label_is_appended_and_old_ids_hold(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=16).manifest
    (raw / "aardvark").mkdir()
    for p in sorted((raw / "03").glob("*.png"))[:5]:
        shutil.copyfile(p, raw / "aardvark" / p.name)
    second = _grow(raw, tmp_path, num_shards=16).manifest
    assert second.labels == (*first.labels, "aardvark")
    assert second.changes == _compared(first, second) and second.changes["labels_added"] == 1
    old, new = _members(first), _members(second)
    assert all(new[p][1] == label for p, (_, label) in old.items())
    assert {new[p][1] for p in new if p.startswith("aardvark/")} == {10}
    info = (Path(second.directory) / "label.labels.txt").read_text().split()
    assert info == list(second.labels)


def test_numeric_folders_map_to_their_number(tmp_path):
    raw = tmp_path / "raw"
    for n in (0, 1, 2, 10, 11, 25):
        (raw / str(n)).mkdir(parents=True)
        (raw / str(n) / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes([n]) * 64)
    m = _grow(raw, tmp_path, num_shards=2, on_error="skip").manifest
    assert m.labels == tuple(str(i) for i in range(26))
    assert {p: label for p, (_, label) in _members(m).items()} == {
        f"{n}/a.png": n for n in (0, 1, 2, 10, 11, 25) if f"{n}/a.png" in _members(m)
    }


def test_a_numeric_folder_fills_the_gap_its_number_left_and_gaps_are_no_labels(tmp_path):
    """00-03, then 07: ids 4-6 are gaps, named 4, 5, 6 in the map; they were counted as 3
    labels added, and a folder 05 later was refused as a renamed '5' (needing --relabel)."""
    raw = tmp_path / "raw"
    for n in (0, 1, 2, 3):
        for k in range(3):
            _grey_png(raw / f"0{n}" / f"{k}.png", 10 * n + k)
    first = _grow(raw, tmp_path, num_shards=2).manifest
    _grey_png(raw / "07" / "a.png", 70)
    second = _grow(raw, tmp_path, num_shards=2).manifest
    assert second.labels == ("00", "01", "02", "03", "4", "5", "6", "07")
    assert second.changes["labels_added"] == 1 and second.changes == _compared(first, second)
    compared = diff.compare(first, second, diff.load_members(first), diff.load_members(second))
    assert compared.labels_added == ("07",)
    shutil.rmtree(raw / "07")
    _grey_png(raw / "05" / "b.png", 50)
    third = _grow(raw, tmp_path, num_shards=2).manifest
    assert third.labels == ("00", "01", "02", "03", "4", "05", "6", "07")
    assert _members(third)["05/b.png"][1] == 5
    assert (third.changes["labels_added"], third.changes["labels_removed"]) == (1, 0)
    assert third.changes["ids_changed"] == 0 and third.changes == _compared(second, third)
    assert third.params["label_gaps"] == [4, 6]
    # A folder named as a gap is (4): a label added. A label removed from the folders (01)
    # keeps its id, which no folder of its number (1) takes: refused as a rename.
    _grey_png(raw / "4" / "c.png", 44)
    shutil.rmtree(raw / "01")
    fourth = _grow(raw, tmp_path, num_shards=2).manifest
    assert fourth.params["label_gaps"] == [6] and fourth.changes["labels_added"] == 1
    assert fourth.changes["labels_removed"] == 0 and fourth.labels == third.labels
    _grey_png(raw / "1" / "d.png", 11)
    with pytest.raises(ConfigError, match=r"folder '1' has the number of the previous"):
        _grow(raw, tmp_path, num_shards=2)


def _grey_png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (4, 4), value).save(path)


def test_the_diff_hint_names_the_old_version_where_it_is(raw, tmp_path):
    """Grown from a version under another --out: the hint's old path is that version's."""
    first = _grow(raw, tmp_path, num_shards=8).manifest
    _add(raw, 3)
    listing = tmp_path / "listing"
    write_listing(list_files(str(raw)), str(listing))
    args = ["write", str(listing), "--out", str(tmp_path / "elsewhere"), "--manifest",
            str(tmp_path / "m2.json"), "--previous", str(tmp_path / "manifest.json"),
            "--no-progress", "--executor", "serial"]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    hint = re.search(r"`(tfshards diff [^`]+)` lists them", done.output)
    assert hint and hint[1].split()[2] == first.directory, done.output
    listed = CliRunner().invoke(app, hint[1].split()[1:])
    assert listed.exit_code == 0 and "added" in listed.output, listed.output


def test_an_id_change_needs_relabel_and_says_so_in_one_line(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=16).manifest
    swapped = (first.labels[1], first.labels[0], *first.labels[2:])
    listing = tmp_path / "listing"
    write_listing(list_files(str(raw)), str(listing))
    args = ["write", str(listing), "--out", str(tmp_path / "shards"), "--manifest",
            str(tmp_path / "manifest.json"), "--labels", ",".join(swapped), "--no-progress",
            "--executor", "serial"]  # fmt: skip
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code != 0
    line = refused.output.strip()
    assert "\n" not in line and "moves label '00' from id 0" in line and "--relabel" in line
    done = CliRunner().invoke(app, [*args[:-3], "--relabel", *args[-3:]])  # as DVC unpacks it
    assert done.exit_code == 0, done.output
    assert "grew from version" in done.output
    assert "0 labels added, 2 ids changed (" in done.output  # the summary hid it
    hint = re.search(r"`(tfshards diff [^`]+)` lists them", done.output)  # a command that works
    assert hint, done.output
    listed = CliRunner().invoke(app, hint[1].split()[1:])
    assert listed.exit_code == 0 and "relabeled" in listed.output, listed.output
    again = CliRunner().invoke(app, [*args[:-3], "--relabel", *args[-3:]])
    assert again.exit_code == 0 and "nothing changed since version" in again.output
    reseeded = CliRunner().invoke(app, [*args, "--seed", "9"])
    assert (
        "not grown from the previous version: seed 0 -> 9 differs from the previous version's"
        in reseeded.output
    )
    resized = CliRunner().invoke(app, [*args, "--seed", "7", "--resize", "8"])
    assert (  # every param that keeps old shards out, not the first alone
        "not grown from the previous version: resize none -> 8; seed 9 -> 7 differ from the "
        "previous version's" in resized.output
    ), resized.output


def test_another_bucket_count_is_refused_unless_the_lineage_starts_anew(raw, tmp_path):
    _grow(raw, tmp_path, num_shards=32)
    with pytest.raises(
        ConfigError, match=r"^buckets: the previous version .* write.previous: none"
    ):
        _grow(raw, tmp_path, num_shards=32, buckets=8)
    (raw / "aardvark").mkdir()  # sorts first, yet keeps the next id: ids are carried
    shutil.copyfile(next(raw.rglob("*.png")), raw / "aardvark" / "a.png")
    before = _grow(raw, tmp_path, num_shards=32).manifest.labels
    result = _grow(raw, tmp_path, num_shards=32, buckets=8, previous=None)
    fresh = result.manifest
    assert fresh.base == "" and fresh.params["buckets"] == 8 and result.fresh
    assert fresh.labels == before and before[-1] == "aardvark"


def test_a_previous_version_gone_from_an_object_store_says_how_to_write_it_again(raw, tmp_path):
    """DVC holds no copy of shards on an object store: `dvc checkout` or `dvc pull`, which
    the line advised, cannot bring them back."""
    import fsspec

    listing = list_files(str(raw))
    config = WriteConfig(
        out="memory://gone/shards", num_shards=4, manifest_copy=str(tmp_path / "m.json")
    )
    first = write(config, listing, progress=False).manifest
    fsspec.filesystem("memory").rm(f"/gone/shards/{first.fingerprint}", recursive=True)
    with pytest.raises(InputError) as caught:
        write(config, listing, progress=False)
    said = str(caught.value)
    assert f"the previous version {first.fingerprint} is missing" in said and "\n" not in said
    assert "DVC holds no copy of shards on an object store" in said
    assert "dvc checkout, or dvc pull" not in said


def test_a_previous_version_that_is_gone_is_one_line(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=16).manifest
    shutil.rmtree(first.directory)
    with pytest.raises(InputError, match=r"dvc pull.*--previous none") as caught:
        _grow(raw, tmp_path, num_shards=16)
    assert "\n" not in str(caught.value)


def test_a_copied_manifest_whose_relative_root_is_not_above_it_says_where_it_looked(
    raw, tmp_path, monkeypatch
):
    """A relative root is looked up from the manifest's place, not the working folder: the
    line said the folder was not there while it was, relative to where write ran."""
    monkeypatch.chdir(tmp_path)
    config = WriteConfig(out="shards", num_shards=4, manifest_copy=str(tmp_path / "m.json"))
    first = write(config, list_files(str(raw)), progress=False).manifest
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    shutil.copyfile(tmp_path / "m.json", elsewhere / "prev.json")
    again = dataclasses.replace(config, previous=str(elsewhere / "prev.json"))
    with pytest.raises(InputError) as caught:
        write(again, list_files(str(raw)), progress=False)
    assert str(caught.value).startswith(
        f"{elsewhere / 'prev.json'}: the previous version {first.fingerprint} is missing (no "
        f"folder shards/{first.fingerprint} in the manifest's folder {elsewhere} nor in one "
        "above it, up to the project's top: pruned, deleted or not checked out); restore it"
    )


def test_the_same_history_gives_the_same_bytes_in_another_folder(raw, tmp_path):
    other = tmp_path / "clone" / "raw"
    shutil.copytree(raw, other)
    names = []
    for root, out in ((raw, tmp_path / "a"), (other, tmp_path / "b")):
        _grow(root, out, num_shards=16)
        _add(root, 30)
        names.append(_grow(root, out, num_shards=16).manifest)
    a, b = names
    assert a.fingerprint == b.fingerprint and a.base == b.base != ""
    assert [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards]
    assert dataclasses.replace(a, root=b.root).to_json() == b.to_json()


@pytest.mark.parametrize("odd", ["ü_tilde.png", 'q"uote.png', "back\\slash.png"])
def test_paths_with_escapes_or_non_ascii_are_matched(make_raw, tmp_path, odd):
    raw = make_raw(60, 8, fmt="png", classes=2)
    first_file = sorted(raw.rglob("*.png"))[0]
    shutil.copyfile(first_file, first_file.parent / odd)
    first = _grow(raw, tmp_path, num_shards=4).manifest
    added = _add(raw, 1)
    second = _grow(raw, tmp_path, num_shards=4).manifest
    assert second.changes["added"] == 1 and second.changes["unchanged"] == 61
    assert second.changes == _compared(first, second)
    assert {s.sha256 for s in first.shards} <= {s.sha256 for s in second.shards}
    assert added[0] in _members(second)


def test_a_previous_version_missing_a_shard_it_would_lend_is_refused_in_one_line(raw, tmp_path):
    """Planned anew, the write would name another version than a clone holding the shard
    grows, and (old_versions remove) delete the committed one: it stops instead."""
    _grow(raw, tmp_path, num_shards=16)
    _add(raw, 20)
    grown = _grow(raw, tmp_path, num_shards=16).manifest
    (Path(grown.directory) / grown.shards[3].name).unlink()  # an interrupted copy, a hand
    for added in (0, 5):  # the same files, then more
        _add(raw, added, seed=2)
        with pytest.raises(ShardError) as refused:
            _grow(raw, tmp_path, num_shards=16)
        assert str(refused.value) == (
            f"the previous version {grown.fingerprint} lacks shard {grown.shards[3].name}: "
            "restore it (dvc checkout --force, dvc pull, or a copy) to grow from it, or set "
            "write.previous: none (--previous none) to write every shard anew as a new lineage"
        )
    fresh = _grow(raw, tmp_path, num_shards=16, previous="none")
    assert fresh.manifest.base == "" and fresh.manifest.labels == grown.labels
    assert validate(ValidateConfig(str(tmp_path / "manifest.json"))).ok


@pytest.mark.parametrize("odd", [None, 'q"uote.png'])
def test_the_c_match_finds_what_the_python_ones_do(raw, tmp_path, monkeypatch, odd):
    first = _grow(raw, tmp_path, num_shards=16).manifest
    _add(raw, 7)
    files = sorted(raw.rglob("*.png"))
    files[5].write_bytes(files[6].read_bytes())  # another content
    files[9].unlink()
    if odd:
        shutil.copyfile(files[0], files[0].parent / odd)
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    stored = open_stored(str(tmp_path / "listing"))
    assert stored is not None
    labels, ids = list(stored.labels), list(range(len(stored.labels)))
    c_found = None
    if native.NATIVE is not None:  # the C pass takes a plain listing, and hands others back
        c_found = growth.match(first, stored, labels, ids)
        plain = native.NATIVE.match_members(stored.jsonl(), stored.files, [b"0"] * len(ids), [])
        assert (plain is None) == bool(odd)
    monkeypatch.setattr(native, "NATIVE", None)
    as_bytes = growth.match(first, stored, labels, ids)  # the regex pass and dict of lines
    decoded = growth.match(first, list_files(str(raw)), labels, ids)  # a listing in memory
    assert as_bytes == decoded
    assert (decoded.added, decoded.changed, decoded.removed) == (7 + bool(odd), 1, 1)
    assert sum(h is not None and -1 not in h for _, h in decoded.held) == 14  # 2 shards touched
    if c_found is not None:
        assert c_found == decoded


def test_a_stored_listing_with_a_label_id_out_of_range_is_one_line(raw, tmp_path, loop):
    first = _grow(raw, tmp_path, num_shards=8).manifest
    _add(raw, 3)
    listing = tmp_path / "listing"
    write_listing(list_files(str(raw)), str(listing))
    edit_listing_line(listing, 4, b'"label_index":0', b'"label_index":77')
    config = WriteConfig(
        out=str(tmp_path / "shards"), manifest_copy=str(tmp_path / "manifest.json"),
        previous=str(Path(first.directory) / layout.MANIFEST_NAME), executor="serial",
        num_shards=8,
    )  # fmt: skip
    with pytest.raises(
        InputError, match=r"files\.jsonl:5: expected 'label_index' in 0\.\.9, found 77$"
    ):
        write(config, str(listing), progress=False)


def test_a_member_list_holding_a_record_twice_is_written_again(raw, tmp_path, loop):
    first = _grow(raw, tmp_path, num_shards=8).manifest

    def first_row_twice(rows: list[bytes]) -> None:  # and the second row gone
        rows[1] = rows[0]

    digest = edit_member_rows(first, first.shards[2], first_row_twice, tmp_path / "manifest.json")
    _add(raw, 3)
    listing = tmp_path / "listing"
    write_listing(list_files(str(raw)), str(listing))
    config = WriteConfig(
        out=str(tmp_path / "shards"), manifest_copy=str(tmp_path / "manifest.json"),
        executor="serial", num_shards=8,
    )  # fmt: skip
    grown = write(config, str(listing), progress=False).manifest
    paths = [row[0] for _, rows in diff.load_members(grown) for row in rows]
    assert sorted(paths) == sorted(set(paths)) and len(paths) == FILES + 3 == grown.records
    assert digest not in {s.records_sha256 for s in grown.shards}  # that list was not kept


def test_a_member_list_with_a_label_id_out_of_range_names_its_line(raw, tmp_path, loop):
    first = _grow(raw, tmp_path, num_shards=8).manifest
    shard = first.shards[5]

    def label_99(rows: list[bytes]) -> None:  # of 10 labels
        rows[2] = rows[2][: rows[2].rindex(b",")] + b",99]"

    edit_member_rows(first, shard, label_99, tmp_path / "manifest.json")
    _add(raw, 2)
    with pytest.raises(
        InputError, match=rf"{shard.name}\.jsonl:3: expected a label id below 10, found 99$"
    ):
        _grow(raw, tmp_path, num_shards=8)


def test_a_file_left_out_for_its_bytes_stays_out_unread_and_is_no_change(make_raw, tmp_path):
    """A rejected file listed again unchanged: no new shard, no "added", the same version."""
    raw = make_raw(60, 8, fmt="png", classes=3)
    bad = raw / sorted(p.name for p in raw.iterdir())[0] / "empty.png"
    bad.write_bytes(b"")
    first = _grow(raw, tmp_path, on_error="skip").manifest
    assert [r.path for r in first.rejected] == [bad.relative_to(raw).as_posix()]
    assert first.rejected[0].token.startswith("sha256:")
    again = _grow(raw, tmp_path, on_error="skip")
    assert again.unchanged and again.manifest.fingerprint == first.fingerprint
    with pytest.raises(InputError, match=r"empty\.png: empty file"):  # fail: still bad, fails
        _grow(raw, tmp_path)
    added = _add(raw, 2)
    second = _grow(raw, tmp_path, on_error="skip").manifest
    assert second.changes["added"] == len(added) == _compared(first, second)["added"]
    assert second.rejected == first.rejected and second.records == first.records + 2
    assert all(s.records for s in second.shards)  # no shard of the reject alone
    bad.write_bytes(_png(raw))  # fixed: another token, read again, now a record
    third = _grow(raw, tmp_path, on_error="skip").manifest
    assert third.rejected == () and third.changes["added"] == 1
    assert third.records == second.records + 1


def test_files_rejected_while_growing_count_as_neither_added_nor_changed(make_raw, tmp_path):
    raw = make_raw(60, 8, fmt="png", classes=3)
    first = _grow(raw, tmp_path, on_error="skip").manifest
    label = sorted(p.name for p in raw.iterdir())[0]
    (raw / label / "notes.png").write_bytes(b"plain text, not an image")  # new, rejected
    emptied = sorted((raw / label).glob("*.png"))[0]
    emptied.write_bytes(b"")  # was a record, rejected now
    second = _grow(raw, tmp_path, on_error="skip").manifest
    assert {r.path for r in second.rejected} == {f"{label}/notes.png", f"{label}/{emptied.name}"}
    assert second.records == first.records - 1
    assert second.changes["added"] == 0 and second.changes["changed"] == 0
    assert second.changes["removed"] == 1
    assert second.changes == _compared(first, second)
    again = _grow(raw, tmp_path, on_error="skip")  # a shard of rejects alone stays, unchanged
    assert again.unchanged and again.manifest.fingerprint == second.fingerprint


def test_a_file_left_out_because_it_could_not_be_read_is_tried_again(make_raw, tmp_path):
    """A reject that reading caused (no token) is not carried: the next write reads it."""
    raw = make_raw(40, 8, fmt="png", classes=2)
    unreadable = _Rejects(str(raw), "skip")
    entry = next(iter(list_files(str(raw)).entries))
    unreadable.add(PermissionError(13, "Permission denied"), entry)
    unreadable.add(InputError("not an image", path=entry.path), entry)
    changed = "file changed since it was listed: expected 87 bytes, found 90"
    unreadable.add(ChangedSinceListingError(changed, path=entry.path), entry)
    assert [r.token for r in unreadable.found] == ["", entry.token, ""]  # the first and last:
    # read again by the next write (a file put back as listed must become a record)
    first = _grow(raw, tmp_path).manifest
    base = dataclasses.replace(first, rejected=(unreadable.found[0],))
    listing = list_files(str(raw))
    rest = array("I", range(listing.files))
    assert _rejected_again(listing, rest, base) == (rest, ())  # read again
    base = dataclasses.replace(first, rejected=(unreadable.found[1],))
    left, again = _rejected_again(listing, rest, base)
    assert again == (unreadable.found[1],) and len(left) == listing.files - 1


def _png(raw: Path) -> bytes:
    return next(raw.rglob("*.png")).read_bytes()


def _cli_set(make_raw, tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """40 PNGs in 2 labels, listed; the raw folder, the listing and a serial write's args."""
    raw = make_raw(40, 8, fmt="png", classes=2)
    listing = tmp_path / "listing"
    write_listing(list_files(str(raw)), str(listing))
    args = ["write", str(listing), "--out", str(tmp_path / "shards")]
    args += ["--manifest", str(tmp_path / "m.json"), "--executor", "serial"]
    return raw, listing, args


def test_more_buckets_asked_of_a_lineage_are_refused_in_a_line_that_says_why(make_raw, tmp_path):
    raw, listing, args = _cli_set(make_raw, tmp_path)
    assert CliRunner().invoke(app, args).exit_code == 0
    _add(raw, 2)
    write_listing(list_files(str(raw)), str(listing))
    grown = CliRunner().invoke(app, [*args, "--buckets", "32"])
    assert grown.exit_code == 0, grown.output
    assert grown.output.strip().splitlines()[-1] == (
        "buckets: kept the lineage's 16 split buckets, not 32: more would move records "
        "across the split (--previous none starts a lineage with them)"
    )
    assert "2 records added" in grown.output


def test_more_buckets_asked_when_nothing_changed_are_said_kept_too(make_raw, tmp_path):
    *_, args = _cli_set(make_raw, tmp_path)
    assert CliRunner().invoke(app, args).exit_code == 0
    again = CliRunner().invoke(app, [*args, "--buckets", "32"])
    assert again.exit_code == 0, again.output
    assert "nothing changed since version" in again.output
    assert again.output.strip().splitlines()[-1] == (
        "buckets: kept the lineage's 16 split buckets, not 32: more would move records "
        "across the split (--previous none starts a lineage with them)"
    )


def test_a_new_lineage_keyed_otherwise_warns_that_records_may_change_sides(make_raw, tmp_path):
    *_, args = _cli_set(make_raw, tmp_path)
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    same_keys = CliRunner().invoke(app, [*args, "--previous", "none", "--seed", "7"])
    assert same_keys.exit_code == 0 and "warning" not in same_keys.output, same_keys.output
    old = Manifest.from_json((tmp_path / "m.json").read_bytes()).fingerprint
    (tmp_path / "m16.json").write_bytes((tmp_path / "m.json").read_bytes())
    anew = CliRunner().invoke(app, [*args, "--previous", "none", "--buckets", "8"])
    assert anew.exit_code == 0, anew.output
    assert (
        f"warning: the split is keyed anew since version {old}: buckets 16 -> 8: records may "
        "have changed sides, so a model trained on the old version would be scored partly on "
        "its own training records (with another number of buckets every record may have "
        "moved; `tfshards diff OLD NEW` cannot compare sides, and lists the files added and "
        "removed)"
    ) in anew.stderr.splitlines()
    # Keyed by group with as many buckets: diff counts the records that moved, as it says.
    (tmp_path / "m.json").write_bytes((tmp_path / "m16.json").read_bytes())
    grouped = CliRunner().invoke(app, [*args, "--previous", "none", "--group-by", "[^/]+$"])
    assert grouped.exit_code == 0, grouped.output
    assert "buckets " not in grouped.stderr, grouped.stderr
    assert "(`tfshards diff OLD NEW` counts those moved to another bucket)" in grouped.stderr
    metrics = tmp_path / "diff.json"
    args = ["diff", str(tmp_path / "m16.json"), str(tmp_path / "m.json"), "--metrics", str(metrics)]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert isinstance(json.loads(metrics.read_text())["diff"]["moved_buckets"], int)


def test_a_new_shard_damaged_in_a_grown_version_gets_no_hint_about_kept_shards(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=8).manifest
    _add(raw, 3)
    second = _grow(raw, tmp_path, num_shards=8).manifest
    kept = {s.sha256 for s in first.shards}
    new = next(s for s in second.shards if s.sha256 not in kept)
    path = Path(second.directory) / new.name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    args = ["validate", str(tmp_path / "manifest.json"), "--workers", "1"]
    checked = CliRunner().invoke(app, args)
    assert checked.exit_code == 1 and f"{new.name}: sha256 mismatch" in checked.stderr
    assert "hint:" not in checked.stderr


def test_a_kept_shard_damaged_in_the_base_fails_validate_with_the_way_out(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=8).manifest
    shard = Path(first.directory) / first.shards[0].name
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # damaged in place, at its size, its mtime kept (as a
    written = shard.stat()  # disk error leaves it): the grown write links it unread
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(written.st_atime_ns, written.st_mtime_ns))
    _add(raw, 3)
    second = _grow(raw, tmp_path, num_shards=8).manifest
    assert second.base == first.fingerprint
    args = ["validate", str(tmp_path / "manifest.json"), "--metrics", str(tmp_path / "v.json")]
    checked = CliRunner().invoke(app, [*args, "--workers", "1"])
    assert checked.exit_code == 1
    hint = [line for line in checked.stderr.splitlines() if line.startswith("hint:")]
    assert hint == [
        f"hint: version {second.fingerprint} grew from {first.fingerprint} and shares the "
        "files of the shards it kept (hard links, never read when linked), so damage to one "
        "is damage to both; restore the version (`dvc checkout --force`, or `git checkout "
        "dvc.lock && dvc checkout --force` if this run's write recorded it), or `tfshards "
        "write --previous none` (write.previous: none) writes every shard anew as a new "
        "lineage, in which records may change sides of the split"
    ]
    fresh = _grow(raw, tmp_path, num_shards=8, previous=None).manifest
    assert (
        CliRunner()
        .invoke(
            app,
            [
                "validate",
                str(Path(fresh.directory) / "manifest.json"),
                "--metrics",
                str(tmp_path / "w.json"),
            ],
        )
        .exit_code
        == 0
    )


def test_a_set_started_from_a_few_files_grows_with_every_bucket(make_raw, tmp_path):
    """A first version of 2 files (a shard each) takes all 16 buckets: grown to 40 files,
    its split is near the fraction asked, not 1 of 2 buckets (50%)."""
    raw = make_raw(40, 8, fmt="png", classes=2)
    aside = tmp_path / "aside"
    shutil.copytree(raw, aside)
    for p in sorted(raw.rglob("*.png"))[2:]:
        p.unlink()
    first = _grow(raw, tmp_path).manifest
    assert first.records == 2 and first.params["buckets"] == 16
    shutil.rmtree(raw)
    shutil.copytree(aside, raw)
    grown = _grow(raw, tmp_path).manifest
    assert grown.base == first.fingerprint and grown.params["buckets"] == 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SplitWarning)  # 40 files in 16 buckets: coarse
        part = split(grown, 0.2, seed=0)
    assert 0 < part.val_records <= 0.35 * grown.records


def test_a_lineage_of_one_bucket_is_not_kept(make_raw, tmp_path):
    """One shard of many files gives 1 bucket, which splits nothing: the next version,
    with more shards, is written anew with every bucket, saying why."""
    raw = make_raw(40, 8, fmt="png", classes=2)
    first = _grow(raw, tmp_path, num_shards=1).manifest
    assert first.params["buckets"] == 1
    grown = _grow(raw, tmp_path)
    assert grown.manifest.params["buckets"] == 16 and "1 split bucket" in grown.fresh
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SplitWarning)  # 40 files in 16 buckets: coarse
        part = split(grown.manifest, 0.2, seed=0)
    assert part.val_records and part.train_records


def test_a_group_by_set_of_a_shard_per_group_takes_every_bucket(make_raw, tmp_path):
    raw = make_raw(40, 8, fmt="png", classes=2)
    first = _grow(raw, tmp_path, group_by=r"^(\d+)/").manifest  # 2 groups: the label folders
    assert len(first.shards) == 2 and first.params["buckets"] == 16


def test_switching_on_error_over_unchanged_clean_data_keeps_the_version(make_raw, tmp_path):
    raw = make_raw(30, 8, fmt="png", classes=2)
    first = _grow(raw, tmp_path, on_error="skip").manifest
    again = _grow(raw, tmp_path)  # fail: nothing to reject, nothing changed
    assert again.unchanged and again.manifest.fingerprint == first.fingerprint


def test_files_moved_to_another_label_are_counted_warned_and_listed_when_they_change_bucket(
    raw, tmp_path
):
    # A label fixed by moving the file: the same bytes under another path, so another key.
    first = _grow(raw, tmp_path, num_shards=32).manifest
    count = first.params["buckets"]
    folders = sorted(p.name for p in raw.iterdir())
    pairs = []
    for p in random.Random(3).sample(sorted(raw.rglob("*.png")), 20):
        folder = folders[(folders.index(p.parent.name) + 1) % len(folders)]
        new = raw / folder / f"moved_{p.name}"
        p.rename(new)
        pairs.append((str(p.relative_to(raw)), str(new.relative_to(raw))))
    crossed = sum(buckets.bucket_of(a, count) != buckets.bucket_of(b, count) for a, b in pairs)
    assert 0 < crossed < 20  # the sample has both kinds (seeded)
    second = _grow(raw, tmp_path, num_shards=32).manifest
    assert second.changes["moved_files"] == crossed
    assert second.changes["moved_buckets"] == 0  # no surviving path changed bucket
    found = diff.compare(first, second, diff.load_members(first), diff.load_members(second))
    assert found.moved_paths == tuple(sorted(pairs))
    assert found.moved_files == crossed
    assert found.to_metrics()["moved_files"] == crossed  # one key, one meaning
    line = found.lines()[-1]
    assert f"moved: 20 files' bytes are now under another path, {crossed} of them" in line
    manifest = str(tmp_path / "manifest.json")
    warned = validate(ValidateConfig(manifest=manifest, fail_on_leakage=False))
    assert warned.problem_count == 0
    assert [w for w in warned.warnings if w.startswith(f"split: {crossed} files moved")]
    balance = [w for w in warned.warnings if "files moved" not in w]  # class balance only
    assert warned.metrics()["split"]["balance_warnings"] == len(balance)
    assert warned.metrics()["growth"]["moved_files"] == crossed
    failed = validate(ValidateConfig(manifest=manifest, fail_on_leakage=True))
    assert [p for p in failed.problems if "files moved or renamed" in p.what]


def test_diff_quotes_a_path_that_would_print_misleadingly():
    from tfshards.cli.diff import shown

    assert shown("cat/a b.png") == "cat/a b.png"
    assert shown("cat/caf\u00e9.png") == "cat/caf\u00e9.png"  # NFC prints as is
    assert shown("cat/cafe\u0301.png") == '"cat/cafe\\u0301.png"'  # NFD would look the same
    assert shown("cat/two\nlines.png") == '"cat/two\\nlines.png"'


def test_another_group_by_is_refused_naming_the_values_as_params_yaml_spells_them(raw, tmp_path):
    _grow(raw, tmp_path, num_shards=32)
    _add(raw, 5)
    with pytest.raises(ConfigError) as refused:
        _grow(raw, tmp_path, num_shards=32, group_by="[^/]+$")
    assert "written with group_by none, this write has '[^/]+$': records would" in str(
        refused.value
    )


def _crossing(raw: Path, count: int) -> tuple[Path, Path]:
    """A file and another file in another label folder whose path is in another bucket."""
    files = sorted(p for p in raw.rglob("*.png"))
    for p in files:
        for q in files:
            a, b = str(p.relative_to(raw)), str(q.relative_to(raw))
            if p.parent != q.parent and buckets.bucket_of(a, count) != buckets.bucket_of(b, count):
                return p, q
    raise AssertionError("no pair in two buckets")


def test_a_moved_file_copied_three_times_more_counts_once_in_write_and_diff(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=32).manifest
    moved, target = _crossing(raw, first.params["buckets"])
    new = target.with_name("moved_" + target.name)
    moved.rename(new)
    for k in range(3):  # copies of the same bytes under new names: added, not moved
        shutil.copyfile(new, new.with_name(f"copy{k}_{new.name}"))
    second = _grow(raw, tmp_path, num_shards=32).manifest
    found = diff.compare(first, second, diff.load_members(first), diff.load_members(second))
    assert len(found.moved_paths) == 1 and second.changes["removed"] == 1
    assert second.changes.get("moved_files", 0) == found.moved_files <= 1


def test_a_file_moved_onto_an_existing_name_counts_as_moved(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=32).manifest
    moved, target = _crossing(raw, first.params["buckets"])
    moved.replace(target)  # mv -f: the target's old bytes are gone, the moved ones are there
    second = _grow(raw, tmp_path, num_shards=32).manifest
    assert (second.changes["removed"], second.changes["changed"]) == (1, 1)
    assert second.changes["moved_files"] == 1
    found = diff.compare(first, second, diff.load_members(first), diff.load_members(second))
    pair = (str(moved.relative_to(raw)), str(target.relative_to(raw)))
    assert found.moved_paths == (pair,) and found.moved_files == 1


def test_the_moved_files_line_names_the_group_when_records_are_keyed_by_group(raw, tmp_path):
    first = _grow(raw, tmp_path, num_shards=32, group_by="^[^/]+/[^/]+$").manifest
    count = first.params["buckets"]
    for p in sorted(raw.rglob("*.png")):  # a rename that takes the file to another group
        q = p.with_name("x" + p.name)
        a, b = str(p.relative_to(raw)), str(q.relative_to(raw))
        if buckets.bucket_of(a, count) != buckets.bucket_of(b, count):
            p.rename(q)
            break
    second = _grow(raw, tmp_path, num_shards=32, group_by="^[^/]+/[^/]+$").manifest
    line = diff.moved_files_line(second)
    assert "(the same bytes under another group_by group)" in line
    assert "choose a group_by that a move leaves alone" in line
    assert line.startswith("split: 1 file moved or renamed since version")
    plain = dataclasses.replace(second, params={**second.params, "group_by": None})
    assert (
        "(write.group_by: '[^/]+$', which a lineage takes from its first version: with "
        "write.previous: none once" in diff.moved_files_line(plain)
    )


def test_another_num_shards_over_unchanged_data_keeps_the_version(make_raw, tmp_path):
    """Growing, num_shards only sizes new shards: with nothing new the version is the same
    (it used to get a new name for the same shard files, and DVC trained on them again)."""
    raw = make_raw(60, 8, fmt="png", classes=2)
    first = _grow(raw, tmp_path, num_shards=16).manifest
    again = _grow(raw, tmp_path, num_shards=4)
    assert again.unchanged and again.manifest.fingerprint == first.fingerprint
    args = ["write", str(tmp_path / "listing"), "--out", str(tmp_path / "shards")]
    args += ["--manifest", str(tmp_path / "manifest.json"), "--num-shards", "4"]
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    said = CliRunner().invoke(app, args)
    assert said.exit_code == 0, said.output
    assert f"nothing changed since version {first.fingerprint}" in said.output
    assert "num_shards: the version keeps its 16 shards; 4 sizes the shards new records" in (
        said.output
    )
    added = _add(raw, 6)
    grown = _grow(raw, tmp_path, num_shards=4).manifest
    assert grown.base == first.fingerprint and grown.params["num_shards"] == 4
    assert grown.records == 66 and len(added) == 6
