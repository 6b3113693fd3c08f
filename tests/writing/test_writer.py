"""The write stage: round trips through tf.data, determinism, atomicity, resume, bad inputs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards import atomicfile, storage
from tfshards.cli import app
from tfshards.errors import ConfigError, InputError, ShardError, TransformError
from tfshards.format import tfrecord
from tfshards.format.exampleparser import decode
from tfshards.listing.listing import Listing, list_files, write_listing
from tfshards.listing.storedlisting import StoredListing
from tfshards.run.executor import RunOptions
from tfshards.run.localexec import ProcessExecutor
from tfshards.shardset.buckets import bucket_of
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest
from tfshards.writing import plan, writer
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def raw(make_raw: Callable[..., Path]) -> Path:
    return make_raw(103, 16)


@pytest.fixture
def listing(raw: Path) -> Listing:
    return list_files(str(raw))


@pytest.fixture
def write_options() -> dict[str, object]:
    return {"executor": "serial"}


def _shard_bytes(manifest: Manifest) -> dict[str, bytes]:
    fs, root = storage.open_url(manifest.root)
    return {s.name: fs.cat_file(storage.join(root, s.name)) for s in manifest.shards}


def test_records_round_trip_through_tf_data(write_set, listing, raw, tmp_path):
    import tensorflow as tf

    manifest = write_set(listing, tmp_path / "out", num_shards=4)
    files = [manifest.shard_url(s) for s in manifest.shards]
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "path": tf.io.FixedLenFeature([], tf.string),
        "sha256": tf.io.FixedLenFeature([], tf.string),
    }
    seen = {}
    for batch in (
        tf.data.TFRecordDataset(files).batch(32).map(lambda b: tf.io.parse_example(b, spec))
    ):
        for image, label, path, sha in zip(
            batch["image"].numpy(),
            batch["label"].numpy(),
            batch["path"].numpy(),
            batch["sha256"].numpy(),
            strict=True,
        ):
            rel = path.decode()
            assert image == (raw / rel).read_bytes()
            assert sha.decode() == hashlib.sha256(image).hexdigest()
            assert manifest.labels[label] == rel.split("/")[0]
            seen[rel] = label
    assert sorted(seen) == [e.path for e in listing.entries]


def test_shard_names_and_counts_are_exact(write_set, listing, tmp_path):
    manifest = write_set(listing, tmp_path / "out", num_shards=4, name="digits")
    assert [s.name for s in manifest.shards] == [
        f"digits-0000{i}-of-00004.tfrecord" for i in range(4)
    ]
    buckets = [bucket_of(e.path, 4) for e in listing.entries]  # one shard per bucket
    held = [buckets.count(s.bucket) for s in manifest.shards]
    assert [s.records for s in manifest.shards] == held
    assert sorted(s.bucket for s in manifest.shards) == [0, 1, 2, 3]
    assert manifest.records == manifest.listed == 103
    root = Path(manifest.root)
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert on_disk == sorted(
        [MANIFEST_NAME]
        + [s.name for s in manifest.shards]
        + [f"_work/{s.name}.done" for s in manifest.shards]
        + [f"index/{s.name}.idx" for s in manifest.shards]
        + [f"records/{s.name}.jsonl" for s in manifest.shards]
        + [f"imagestats/{s.name}.json" for s in manifest.shards]
        + ["dataset_info.json", "features.json", "label.labels.txt", "imagestats.json"]
    )
    for shard in manifest.shards:
        data = Path(manifest.shard_url(shard)).read_bytes()
        assert len(data) == shard.bytes
        assert hashlib.sha256(data).hexdigest() == shard.sha256


def test_default_shard_count_is_sixteen_for_small_data(write_set, listing, tmp_path):
    assert len(write_set(listing, tmp_path / "out").shards) == 16


def test_bytes_identical_for_any_worker_count_and_executor(write_set, listing, tmp_path):
    out = tmp_path / "out"
    results = []
    for executor, workers in [("serial", 1), ("process", 2), ("thread", 8), ("process", 3)]:
        shutil.rmtree(out, ignore_errors=True)
        manifest = write_set(listing, out, num_shards=5, executor=executor, workers=workers)
        results.append((Path(manifest.root, MANIFEST_NAME).read_bytes(), _shard_bytes(manifest)))
    assert all(r == results[0] for r in results[1:])


def test_memory_storage_gets_the_same_bytes_as_local(write_set, listing, tmp_path):
    local = write_set(listing, tmp_path / "out", num_shards=3)
    remote = write_set(listing, "memory://shards", num_shards=3, executor="auto", workers=2)
    assert remote.root.startswith("memory://")
    assert _shard_bytes(remote) == _shard_bytes(local)
    assert remote.fingerprint == local.fingerprint


def test_process_executor_refuses_memory_storage(write_set, listing):
    with pytest.raises(ConfigError, match="memory:// lives in one process"):
        write_set(listing, "memory://shards", executor="process", workers=2)


def test_new_params_make_a_new_version_and_keep_the_old(write_set, listing, tmp_path):
    a = write_set(listing, tmp_path / "out", num_shards=2, seed=1)
    b = write_set(listing, tmp_path / "out", num_shards=2, seed=2)
    assert a.root != b.root
    assert Path(a.root, MANIFEST_NAME).exists() and Path(b.root, MANIFEST_NAME).exists()
    assert _shard_bytes(a) != _shard_bytes(b)


def test_second_run_reuses_every_shard(listing, tmp_path):
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=4, executor="serial")
    first = write(config, listing, progress=False)
    second = write(config, listing, progress=False)
    assert (first.reused, second.reused) == (0, 4)
    assert first.manifest.to_json() == second.manifest.to_json()


@pytest.mark.parametrize("gone", ["data-00001-of-00004.tfrecord", "index", "records"])
def test_a_file_deleted_while_the_write_ran_publishes_no_manifest(
    listing, tmp_path, monkeypatch, gone
):
    """Another process (a prune of another host, a user) deleting a shard or one of its
    companions before the manifest goes out: one line naming it, no manifest."""
    real = writer._write_metadata

    def delete_then_write(fs, version_path, manifest):  # type: ignore[no-untyped-def]
        shard = manifest.shards[1].name
        name = {"index": f"index/{shard}.idx", "records": f"records/{shard}.jsonl"}.get(gone, gone)
        os.unlink(os.path.join(version_path, name))
        return real(fs, version_path, manifest)

    monkeypatch.setattr(writer, "_write_metadata", delete_then_write)
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=4, executor="serial")
    with pytest.raises(ShardError, match="something deleted it while this write ran") as info:
        write(config, listing, progress=False)
    assert "\n" not in str(info.value) and "data-00001-of-00004.tfrecord" in str(info.value)
    assert not list((tmp_path / "out").rglob(MANIFEST_NAME))


def test_a_versions_files_and_folders_are_synced_after_their_renames_and_before_the_manifest(
    listing, tmp_path, monkeypatch
):
    """Every file the manifest counts on (shards, companions, metadata) is fsynced, most in
    one pass after their renames, then the folders, all before the manifest's rename."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        where = f"/proc/self/fd/{fd}"
        calls.append(("folder" if os.path.isdir(where) else "file", os.path.realpath(where)))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        src = os.path.realpath(src)
        if ("file", src) in calls:  # fsynced under its temp name: count it for its own
            calls.append(("file", os.path.realpath(dst)))
        calls.append(("replace", os.path.realpath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=4, executor="serial")
    version = os.path.realpath(write(config, listing, progress=False).manifest.directory)
    inside = [(kind, p) for kind, p in calls if p == version or p.startswith(version + "/")]
    manifest = inside.index(("replace", os.path.join(version, MANIFEST_NAME)))
    before = inside[:manifest]
    renamed = {p: i for i, (kind, p) in enumerate(before) if kind == "replace"}
    synced = {p for kind, p in before if kind == "file"}
    counted = {
        os.path.realpath(os.path.join(folder, name))
        for folder, _, names in os.walk(version)
        for name in names
        if name != MANIFEST_NAME and "_work" not in folder
    }
    assert len([p for p in counted if p.endswith(".tfrecord")]) == 4
    assert [p for p in counted if p not in synced] == []  # after the write that made it
    last_file = max(renamed.values())
    folders = {os.path.dirname(p) for p in renamed}
    assert len(folders) == 5
    assert {p for kind, p in before[last_file:] if kind == "folder"} == folders
    # No fsync of a folder per file: once when a folder is made (its entry in the
    # version folder), once before the manifest.
    assert len([kind for kind, _ in before if kind == "folder"]) <= 2 * len(folders)


def test_a_file_that_cannot_be_flushed_is_named(tmp_path, monkeypatch):
    fs = storage.open_url(str(tmp_path))[0]
    (tmp_path / "a").write_bytes(b"a")
    with pytest.raises(FileNotFoundError) as raised:
        atomicfile.sync_files(fs, [str(tmp_path / "a"), str(tmp_path / "gone")])
    assert raised.value.filename == str(tmp_path / "gone")


def _dead_writers_tail() -> str:
    """The end of a temp file's name a writer of this host, now dead, would have left."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    host = __import__("socket").gethostname().replace("-", "_") or "host"
    return f".tmp-{host}-{dead.stdout.strip()}-0123abcd"


def test_a_killed_writers_temps_are_swept_from_every_folder_of_the_version(listing, tmp_path):
    # A writer killed mid-shard leaves temps where it was writing: a shard's in _work/, its
    # record index's in index/. The next run over the same version removes all of them.
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=4, executor="serial")
    version = Path(write(config, listing, progress=False).manifest.root)
    tail = _dead_writers_tail()
    planted = [
        version / folder / f".data-00001-of-00004.tfrecord{suffix}{tail}"
        for folder, suffix in [(".", ""), ("_work", ".done"), ("index", ".idx")]
    ]
    for temp in planted:
        assert atomicfile.is_temp_name(temp.name)
        temp.write_bytes(b"half written by a dead process")
    assert write(config, listing, progress=False).reused == 4
    assert [t for t in planted if t.exists()] == []


def test_a_killed_writers_temp_beside_the_manifest_copy_goes_and_no_other_file(listing, tmp_path):
    """A kill between the version's manifest and its copy left ``.m.json.tmp-...`` beside
    the copy for good; only that file's temps of dead writers go, in the user's folder."""
    tail = _dead_writers_tail()
    ours, theirs = tmp_path / f".m.json{tail}", tmp_path / f".notes.txt{tail}"
    for temp in (ours, theirs):
        temp.write_text("left by a dead process")
    config = WriteConfig(
        out=str(tmp_path / "out"), num_shards=4, executor="serial",
        manifest_copy=str(tmp_path / "m.json"),
    )  # fmt: skip
    write(config, listing, progress=False)
    assert not ours.exists() and theirs.exists()


def test_a_version_folder_tfshards_did_not_make_is_refused_and_left_as_it_is(listing, tmp_path):
    """A folder of the user's at a version's name (made, or linked to theirs) had the
    files at a shard's name written over without a word."""
    config = WriteConfig(out=str(tmp_path / "first"), num_shards=4, executor="serial")
    name = Path(write(config, listing, progress=False).manifest.root).name
    theirs = tmp_path / "out" / name
    theirs.mkdir(parents=True)
    mine = theirs / "data-00001-of-00004.tfrecord"
    mine.write_text("my own bytes")
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=4, executor="serial")
    with pytest.raises(ShardError) as caught:
        write(config, listing, progress=False)
    assert str(caught.value) == (
        f"{theirs}: expected a version folder tfshards made (or none), found one holding 1 "
        "entries and no _work/ nor manifest.json (first: 'data-00001-of-00004.tfrecord'): "
        "remove it or pass another --out"
    )
    assert mine.read_text() == "my own bytes" and sorted(theirs.iterdir()) == [mine]
    mine.unlink()
    theirs.rmdir()
    (tmp_path / "elsewhere").mkdir()
    theirs.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ShardError, match=r"found a link: remove it or pass another --out$"):
        write(config, listing, progress=False)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_the_files_every_worker_must_see_are_the_first_of_three_shards(listing, tmp_path):
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=4, executor="serial")
    planned = plan.plan(listing, config, "none", None, None, None)
    firsts = [next(iter(t.rows.batches()))[0].path for t in planned.tasks]
    found = writer._sample_files(planned.tasks)
    assert found == sorted({os.path.join(listing.root, firsts[i]) for i in (0, 2, 3)})


def test_an_out_that_is_a_file_is_named_not_a_lease_inside_it(listing, tmp_path):
    (tmp_path / "afile").write_text("mine")
    config = WriteConfig(out=str(tmp_path / "afile"), num_shards=4, executor="serial")
    with pytest.raises(ShardError) as caught:
        write(config, listing, progress=False)
    assert str(caught.value) == (
        f"{tmp_path / 'afile'}: expected a folder for the shard versions (--out) or none, "
        "found a file"
    )
    assert (tmp_path / "afile").read_text() == "mine"
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    config = WriteConfig(out=str(tmp_path / "dangling"), num_shards=4, executor="serial")
    with pytest.raises(ShardError, match=r"\(--out\) or none, found a link to nothing$"):
        write(config, listing, progress=False)


def test_a_tampered_finished_shard_is_rewritten_on_resume(listing, tmp_path):
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=4, executor="serial")
    manifest = write(config, listing, progress=False).manifest
    victim = Path(manifest.shard_url(manifest.shards[2]))
    good = victim.read_bytes()
    victim.write_bytes(good[:-10])
    again = write(config, listing, progress=False)
    assert again.reused == 3
    assert victim.read_bytes() == good


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compressed_shards_read_back(write_set, listing, tmp_path, compression):
    import tensorflow as tf

    manifest = write_set(listing, tmp_path / "out", num_shards=2, compression=compression)
    files = [manifest.shard_url(s) for s in manifest.shards]
    n = sum(1 for _ in tf.data.TFRecordDataset(files, compression_type=compression.upper()))
    assert n == 103 and manifest.compression == compression


def test_manifest_is_the_local_copy_and_sorted_json(write_set, listing, tmp_path):
    copy = tmp_path / "data" / "manifest.json"
    manifest = write_set(listing, tmp_path / "out", num_shards=2, manifest_copy=str(copy))
    text = copy.read_bytes()
    assert text == Path(manifest.root, MANIFEST_NAME).read_bytes()
    doc = json.loads(text)
    assert doc["version"] == 1 and doc["totals"]["records"] == 103
    assert list(doc) == sorted(doc)


# --------------------------------------------------------------------------- bad inputs


def test_empty_file_fails_naming_it_and_writes_no_manifest(write_set, raw, tmp_path):
    victim = sorted(raw.glob("*/*.jpg"))[5]
    victim.write_bytes(b"")
    listing = list_files(str(raw))
    with pytest.raises(InputError) as info:
        write_set(listing, tmp_path / "out", num_shards=2)
    message = str(info.value)
    assert str(victim) in message and "empty file" in message and "found 0" in message
    assert not list((tmp_path / "out").glob(f"*/{MANIFEST_NAME}"))


def test_file_deleted_after_listing_is_reported(write_set, listing, raw, tmp_path):
    victim = raw / listing.entries[7].path
    victim.unlink()
    with pytest.raises(InputError, match=r"cannot read: No such file or directory"):
        write_set(listing, tmp_path / "out", num_shards=2)


def test_file_changed_after_listing_is_reported_with_sizes(write_set, listing, raw, tmp_path):
    victim = raw / listing.entries[3].path
    expected = listing.entries[3].size
    victim.write_bytes(victim.read_bytes() + b"x")
    with pytest.raises(InputError) as info:
        write_set(listing, tmp_path / "out", num_shards=2)
    assert f"expected {expected} bytes, found {expected + 1}" in str(info.value)
    assert listing.entries[3].path in str(info.value)


def test_skip_records_rejects_and_counts_reconcile(write_set, raw, tmp_path):
    victims = sorted(raw.glob("*/*.jpg"))[:2]
    for v in victims:
        v.write_bytes(b"")
    listing = list_files(str(raw))
    manifest = write_set(listing, tmp_path / "out", num_shards=3, on_error="skip")
    assert sorted(r.path for r in manifest.rejected) == sorted(
        str(v.relative_to(raw)) for v in victims
    )
    assert all("empty file" in r.reason for r in manifest.rejected)
    assert manifest.listed == manifest.records + len(manifest.rejected) == 103


def test_a_transient_reject_is_retried_by_the_next_write_not_reused(write_set, raw, tmp_path):
    listing = list_files(str(raw))
    victim = raw / listing.entries[7].path
    good = victim.read_bytes()
    victim.write_bytes(b"")  # briefly unreadable as listed
    first = write_set(listing, tmp_path / "out", num_shards=3, on_error="skip")
    assert [r.path for r in first.rejected] == [listing.entries[7].path]
    with pytest.raises(InputError, match=re.escape(f"{victim}: empty file")):
        write_set(listing, tmp_path / "out", num_shards=3, on_error="fail")  # still bad: fails
    victim.write_bytes(good)  # back as listed
    again = write_set(listing, tmp_path / "out", num_shards=3, on_error="fail")
    assert again.fingerprint == first.fingerprint and again.rejected == ()
    assert again.records == again.listed == 103
    fresh = write_set(listing, tmp_path / "fresh", num_shards=3)
    assert _shard_bytes(again) == _shard_bytes(fresh)


@pytest.mark.timeout(60)  # opening a FIFO for reading waits for a writer, forever
@pytest.mark.parametrize("transform", [None, "tx_mod:nothing"])
def test_a_listed_file_replaced_by_a_fifo_is_rejected_never_opened(
    write_set, listing, raw, tmp_path, loop, transforms_module, transform
):
    rel = listing.entries[5].path
    (raw / rel).unlink()
    os.mkfifo(raw / rel)  # between list and write
    manifest = write_set(
        listing, tmp_path / "out", num_shards=2, on_error="skip", transform=transform
    )
    assert [(r.path, r.reason) for r in manifest.rejected] == [
        (rel, "expected a regular file, found a FIFO")
    ]
    with pytest.raises(InputError) as info:
        write_set(listing, tmp_path / "again", num_shards=2, transform=transform)
    assert str(info.value) == f"{raw / rel}: cannot read: expected a regular file, found a FIFO"


def test_a_file_listed_empty_that_has_bytes_now_reads_the_same_in_both_loops(
    write_set, raw, tmp_path, loop
):
    victim = sorted(raw.glob("*/*.jpg"))[4]
    victim.write_bytes(b"")
    listing = list_files(str(raw))
    victim.write_bytes(b"x" * 100)
    manifest = write_set(listing, tmp_path / "out", num_shards=2, on_error="skip")
    assert [(r.path, r.reason) for r in manifest.rejected] == [
        (
            str(victim.relative_to(raw)),
            "file changed since it was listed: expected 0 bytes, found 100",
        )
    ]


def test_a_failed_write_names_every_bad_file_of_the_run_in_one_line(write_set, raw, tmp_path):
    """Under on_error fail, one run finds all the bad files (not one a run): the first by
    path, then the others; no manifest; once they are fixed the next run writes the set."""
    files = sorted(raw.glob("*/*.jpg"))
    victims = [files[i] for i in (90, 3, 41)]  # in shards of their own, whatever the order
    good = {v: v.read_bytes() for v in victims}
    for v in victims:
        v.write_bytes(b"")
    listing = list_files(str(raw))
    with pytest.raises(InputError) as info:
        write_set(listing, tmp_path / "out", num_shards=3, workers=2, executor="thread")
    rel = sorted(str(v.relative_to(raw)) for v in victims)
    assert str(info.value) == (
        f"{raw / rel[0]}: empty file: expected at least 1 byte, found 0; 2 more files failed"
        f" too: {rel[1]}, {rel[2]}"
        "; write.on_error: skip leaves such files out"
    )
    assert info.value.path == rel[0]
    assert not list((tmp_path / "out").rglob("manifest.json"))
    for v, data in good.items():
        v.write_bytes(data)
    manifest = write_set(list_files(str(raw)), tmp_path / "out", num_shards=3)
    assert manifest.records == 103 and manifest.rejected == ()


def test_a_write_whose_files_all_fail_stops_a_shard_after_twenty(raw, tmp_path):
    """A broken transform (or a wrong root) fails every file: a shard stops at 20 failures
    (a batch of reads at most beyond them) instead of reading all of its files, and says so."""
    for f in sorted(raw.glob("*/*.jpg")):
        f.write_bytes(b"")
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=1, executor="serial")
    with pytest.raises(InputError) as info:
        write(config, list_files(str(raw)), progress=False)
    line = str(info.value)
    assert "; 19 more files failed too: " in line and ", ...; " not in line
    assert line.endswith(
        ", ... (a shard stopped at 20 bad files: there may be more)"
        "; write.on_error: skip leaves such files out"
    )


def test_cli_reports_bad_input_on_one_line_with_exit_1(raw, tmp_path):
    (sorted(raw.glob("*/*.jpg"))[0]).write_bytes(b"")
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    result = CliRunner().invoke(
        app,
        [
            "write",
            str(tmp_path / "listing"),
            "--out",
            str(tmp_path / "out"),
            "--manifest",
            str(tmp_path / "m.json"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "empty file" in lines[0]
    assert not (tmp_path / "m.json").exists()


def test_cli_writes_and_summarizes(listing, tmp_path):
    write_listing(listing, str(tmp_path / "listing"))
    result = CliRunner().invoke(
        app,
        [
            *("write", str(tmp_path / "listing"), "--out", str(tmp_path / "out")),
            *("--manifest", str(tmp_path / "m.json"), "--num-shards", "4", "--workers", "1"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "wrote 103 records in 4 shards" in result.output
    assert Manifest.from_json((tmp_path / "m.json").read_bytes()).records == 103


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_shards": 0}, "num_shards: expected at least 1, or 0 in params.yaml .* found 0"),
        ({"compression": "lz4"}, "compression must be one of"),
        ({"on_error": "ignore"}, "on_error must be 'fail' or 'skip'"),
        ({"image_feature": "label"}, "image_feature must be a name other than"),
        ({"workers": 0}, "workers must be >= 1, got 0"),
        ({"executor": "ray"}, "executor must be one of"),
        # a[1]-* matched none of its shards: readers find them by NAME-* globs
        ({"name": "a[1]"}, r"name must hold no glob character \(\* \? \[ \]\): readers "),
        ({"name": "x*"}, r"by the glob x\*-\*, which would not match them; got 'x\*'$"),
    ],
)
def test_config_errors_say_what_was_expected(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        WriteConfig(out="x", **kwargs)


def test_more_shards_than_records_is_refused(write_set, listing, tmp_path):
    with pytest.raises(ConfigError, match=r"at most one shard per record \(103\), got 200"):
        write_set(listing, tmp_path / "out", num_shards=200)


# --------------------------------------------------------------------------- groups

LAST_DIGIT = r"(\d)\.jpg$"  # 10 groups across the 16 label folders: 000007.jpg is in group 7


def _groups_per_shard(manifest: Manifest, pattern: str = LAST_DIGIT) -> list[set[str]]:
    found = []
    for data in _shard_bytes(manifest).values():
        paths = [bytes(decode(r.data)["path"][1][0]).decode() for r in tfrecord.scan(data)]
        found.append({m.group(1) for m in map(re.compile(pattern).search, paths) if m})
    return found


def test_group_by_keeps_each_group_in_one_shard_with_the_same_bytes_on_any_workers(
    write_set, listing, tmp_path
):
    write_listing(listing, str(tmp_path / "listing"))
    out = tmp_path / "out"
    runs = [("serial", 1), ("thread", 2), ("process", 2), ("thread", 8), ("process", 8)]
    results = []
    for executor, workers in runs:
        shutil.rmtree(out, ignore_errors=True)
        config = WriteConfig(
            out=str(out), num_shards=8, group_by=LAST_DIGIT, executor=executor, workers=workers
        )
        manifest = write(config, str(tmp_path / "listing"), progress=False).manifest
        results.append((Path(manifest.root, MANIFEST_NAME).read_bytes(), _shard_bytes(manifest)))
    assert all(r == results[0] for r in results[1:])
    groups = _groups_per_shard(manifest)
    assert sum(map(len, groups)) == 10 and set().union(*groups) == set("0123456789")
    assert all(groups), "every shard holds a group"
    # From the listing in memory: the same plan.
    shutil.rmtree(out)
    assert _shard_bytes(write_set(listing, out, num_shards=8, group_by=LAST_DIGIT)) == results[0][1]


def test_group_by_names_another_version_and_is_recorded_in_the_manifest(
    write_set, listing, tmp_path
):
    plain = write_set(listing, tmp_path / "out", num_shards=4)
    grouped = write_set(listing, tmp_path / "out", num_shards=4, group_by=LAST_DIGIT)
    by_folder = write_set(listing, tmp_path / "out", num_shards=4, group_by=r"^([^/]+)/")
    assert len({plain.root, grouped.root, by_folder.root}) == 3
    assert "group_by" not in plain.params  # older sets keep their version names
    assert grouped.params["group_by"] == LAST_DIGIT
    assert any(len(g) > 1 for g in _groups_per_shard(plain))  # without it, groups are spread


def test_group_by_shard_count_is_at_most_the_number_of_groups(write_set, listing, tmp_path):
    assert len(write_set(listing, tmp_path / "out", group_by=LAST_DIGIT).shards) == 10  # not 16
    with pytest.raises(ConfigError, match=r"at most one shard per group \(10 groups under"):
        write_set(listing, tmp_path / "out", num_shards=11, group_by=LAST_DIGIT)


def test_cli_group_by_that_misses_a_path_is_one_line_with_exit_1(listing, tmp_path):
    write_listing(listing, str(tmp_path / "listing"))
    result = CliRunner().invoke(
        app,
        [
            *("write", str(tmp_path / "listing"), "--out", str(tmp_path / "out")),
            *("--manifest", str(tmp_path / "m.json"), "--group-by", "^0[0-8]/", "--no-progress"),
        ],
    )
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ") and "09/000009.jpg: expected its path '09/000009.jpg'" in line
    assert "to match group_by '^0[0-8]/', found no match: widen the pattern" in line
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "out").exists()


def test_cli_help_explains_group_by():
    result = CliRunner().invoke(app, ["write", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # plain help wraps at 80 columns
    assert "--group-by" in text and "first (...) group" in text


# --------------------------------------------------------------------------- transforms

TRANSFORMS = """
import io
import numpy as np
from PIL import Image

def pixels(path, data, label):
    img = np.asarray(Image.open(io.BytesIO(data)).convert("L").resize((4, 4)))
    return {"pixels": img.astype(np.float32) / 255.0, "width": 16, "tag": "x"}

def bad_type(path, data, label):
    return {"oops": object()}

def reserved(path, data, label):
    return {"label": 3}

def flaky(path, data, label):
    if path.endswith("000007.jpg"):
        raise ValueError("cannot decode")
    return {}

def slow(path, data, label):
    import time
    time.sleep(0.03)
    return {}

def nothing(path, data, label):
    return {}

def exits(path, data, label):
    if path.endswith("000007.jpg"):
        raise SystemExit(3)
    return {}

def closes(path, data, label):
    if path.endswith("000007.jpg"):
        raise GeneratorExit
    return {}
"""


@pytest.fixture
def transforms_module(tmp_path, monkeypatch):
    module = tmp_path / "tx_mod.py"
    module.write_text(TRANSFORMS)
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("tx_mod", None)
    return "tx_mod"


def test_transform_features_are_written_and_in_schema(
    write_set, listing, tmp_path, transforms_module
):
    import tensorflow as tf

    manifest = write_set(
        listing, tmp_path / "out", num_shards=2, transform=f"{transforms_module}:pixels"
    )
    schema = {s.name: (s.dtype, s.shape) for s in manifest.schema}
    assert schema["pixels"] == ("float", (4, 4))
    assert schema["width"] == ("int64", ()) and schema["tag"] == ("bytes", ())
    assert manifest.params["transform"].startswith("tx_mod:pixels@")
    record = next(iter(tf.data.TFRecordDataset(manifest.shard_url(manifest.shards[0]))))
    parsed = tf.io.parse_single_example(
        record, {"pixels": tf.io.FixedLenFeature([4, 4], tf.float32)}
    )
    assert parsed["pixels"].shape == (4, 4)


def test_transform_returning_unsupported_type_names_feature_and_type(
    write_set, listing, tmp_path, transforms_module
):
    with pytest.raises(TransformError, match=r"feature 'oops': unsupported type object"):
        write_set(listing, tmp_path / "out", num_shards=2, transform="tx_mod:bad_type")


def test_transform_returning_reserved_feature_fails_even_with_skip(
    write_set, listing, tmp_path, transforms_module
):
    with pytest.raises(TransformError, match="feature 'label' is reserved"):
        write_set(
            listing, tmp_path / "out", num_shards=2, transform="tx_mod:reserved", on_error="skip"
        )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "expected 'package.module:function'"),
        ("missing_mod_xyz:fn", "cannot import module 'missing_mod_xyz'"),
        ("tx_mod:nope", "module 'tx_mod' has no attribute 'nope'"),
    ],
)
def test_bad_transform_spec_is_a_clear_error(
    write_set, listing, tmp_path, transforms_module, spec, message
):
    with pytest.raises(TransformError, match=message):
        write_set(listing, tmp_path / "out", transform=spec)


def test_transform_failure_is_skipped_with_its_reason(
    write_set, listing, tmp_path, transforms_module
):
    manifest = write_set(
        listing, tmp_path / "out", num_shards=2, transform="tx_mod:flaky", on_error="skip"
    )
    assert [r.reason for r in manifest.rejected] == [
        "transform tx_mod:flaky failed: ValueError: cannot decode"
    ]
    assert manifest.records == 102


def test_transform_failure_fails_naming_the_file(write_set, listing, tmp_path, transforms_module):
    with pytest.raises(TransformError, match=r"000007\.jpg: transform tx_mod:flaky failed"):
        write_set(listing, tmp_path / "out", num_shards=2, transform="tx_mod:flaky")


def test_a_transform_that_exits_is_a_failure_naming_the_file(
    write_set, listing, tmp_path, transforms_module
):
    """sys.exit(3) in a transform ended the write with exit 3 and no word; a GeneratorExit
    was a traceback."""
    for name, what in (("exits", "SystemExit: 3;"), ("closes", "GeneratorExit: ;")):
        with pytest.raises(TransformError) as raised:
            write_set(listing, tmp_path / name, num_shards=2, transform=f"tx_mod:{name}")
        assert f"000007.jpg: transform tx_mod:{name} failed: {what}" in str(raised.value)


# --------------------------------------------------------------------------- real processes


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(REPO / "stages" / "write_shards.py"), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


@pytest.mark.slow
def test_fresh_interpreters_write_identical_bytes(listing, tmp_path):
    write_listing(listing, str(tmp_path / "listing"))
    outputs = []
    for i, hashseed in enumerate(["1", "2"]):
        out = tmp_path / f"run{i}"
        proc = _cli(
            str(tmp_path / "listing"),
            "--out",
            "shards",
            "--manifest",
            "manifest.json",
            "--num-shards",
            "3",
            cwd=tmp_path,
            env={"PYTHONHASHSEED": hashseed},
        )
        out.mkdir()
        assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
        shutil.move(tmp_path / "shards", out / "shards")
        shutil.move(tmp_path / "manifest.json", out / "manifest.json")
        outputs.append({p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()})
    assert outputs[0] == outputs[1]


@pytest.mark.slow
@pytest.mark.parametrize("grouping", [[], ["--group-by", LAST_DIGIT]], ids=["records", "groups"])
def test_killed_writer_resumes_to_identical_bytes(listing, tmp_path, transforms_module, grouping):
    write_listing(listing, str(tmp_path / "listing"))
    args = [str(tmp_path / "listing"), "--num-shards", "8", "--transform", "tx_mod:slow"]
    args += ["--workers", "2", "--no-progress", *grouping]
    reference = _cli(*args, "--out", "ref", "--manifest", "ref.json", cwd=tmp_path)
    assert reference.wait(timeout=120) == 0

    victim = _cli(*args, "--out", "out", "--manifest", "out.json", cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "out").glob("*/_work/*.done")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    (version,) = (tmp_path / "out").iterdir()
    assert not (version / MANIFEST_NAME).exists()
    for shard in version.glob("*.tfrecord"):  # whatever is visible is whole
        assert all(s.problem is None for s in tfrecord.scan(shard.read_bytes()))

    resumed = _cli(*args, "--out", "out", "--manifest", "out.json", cwd=tmp_path)
    stdout, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr
    assert b" 0 shards reused, " in stdout and b" resumed)" in stdout  # none from another
    (ref,) = (tmp_path / "ref").iterdir()
    ref_files = {p.relative_to(ref): p.read_bytes() for p in ref.rglob("*") if p.is_file()}
    out_files = {p.relative_to(version): p.read_bytes() for p in version.rglob("*") if p.is_file()}
    assert out_files.keys() == ref_files.keys()  # also: no temp files left behind
    for name, data in out_files.items():  # only the location differs: out/ vs ref/
        assert data == ref_files[name].replace(b'"root": "ref/', b'"root": "out/')


# Kills a process-mode write mid-shard under a "subreaper" that never reaps, as a container
# whose init does not reap orphans: the writer and its workers stay zombies while it resumes.
ZOMBIE_HARNESS = """
import ctypes, json, os, pathlib, signal, subprocess, sys, time
from tfshards import atomicfile

ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans become ours
write = [sys.executable, "-m", "tfshards", *sys.argv[1:]]
victim = subprocess.Popen(write, start_new_session=True)
out = pathlib.Path("out")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    temps = [p for p in out.rglob("*") if atomicfile.is_temp_name(p.name)]
    if len(temps) >= 2:
        break
    time.sleep(0.02)
os.killpg(victim.pid, signal.SIGKILL)  # never reaped: not victim.wait(), no waitpid(-1)
time.sleep(0.5)
zombies = [p.name for p in out.rglob("*") if atomicfile.is_temp_name(p.name)]
resumed = subprocess.run(write, capture_output=True, text=True)
print(json.dumps({"temps": zombies, "rc": resumed.returncode, "stderr": resumed.stderr}))
"""


@pytest.mark.slow
def test_resume_after_killed_workers_left_as_zombies_validates(
    listing, tmp_path, transforms_module
):
    from tfshards.validation.validate import ValidateConfig, validate

    write_listing(listing, str(tmp_path / "listing"))
    args = ["write", str(tmp_path / "listing"), "--out", "out", "--manifest", "m.json"]
    args += ["--num-shards", "4", "--transform", "tx_mod:slow", "--executor", "process"]
    args += ["--workers", "3", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{tmp_path}"}
    harness = subprocess.run(
        [sys.executable, "-c", ZOMBIE_HARNESS, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert harness.returncode == 0, harness.stderr
    seen = json.loads(harness.stdout.splitlines()[-1])
    assert len(seen["temps"]) >= 2  # the killed writers' temp files were there at resume
    assert seen["rc"] == 0, seen["stderr"]
    report = validate(ValidateConfig(manifest=str(tmp_path / "m.json"), executor="serial"))
    assert report.ok, report.problems


@pytest.mark.slow
def test_two_racing_writers_leave_one_valid_set(listing, tmp_path, transforms_module):
    write_listing(listing, str(tmp_path / "listing"))
    args = [str(tmp_path / "listing"), "--num-shards", "6", "--transform", "tx_mod:slow"]
    args += ["--out", "out", "--manifest", "m.json", "--workers", "1", "--no-progress"]
    procs = [_cli(*args, cwd=tmp_path) for _ in range(2)]
    assert [p.wait(timeout=180) for p in procs] == [0, 0]
    manifest = Manifest.from_json((tmp_path / "m.json").read_bytes())
    for shard in manifest.shards:
        data = (tmp_path / manifest.shard_url(shard)).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard.sha256
    assert not [p for p in (tmp_path / manifest.root).rglob("*") if atomicfile.is_temp_name(p.name)]


@pytest.mark.slow
def test_dask_executor_writes_the_same_bytes(write_set, listing, tmp_path):
    pytest.importorskip("distributed")
    local = write_set(listing, tmp_path / "a", num_shards=4)
    dask = write_set(listing, tmp_path / "b", num_shards=4, executor="dask", workers=2)
    assert _shard_bytes(dask) == _shard_bytes(local)


def test_stage_script_help_runs_in_a_real_process():
    result = subprocess.run(
        [sys.executable, str(REPO / "stages" / "write_shards.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert "--num-shards" in result.stdout and "byte-identical" in result.stdout


def test_workers_start_before_the_listing_is_loaded(listing, tmp_path, monkeypatch):
    """Forked after it, each worker's RSS would count the whole listing: memory grows with data."""
    write_listing(listing, str(tmp_path / "listing"))
    workers_alive = []
    real = writer.open_stored
    before = {p.pid for p in multiprocessing.active_children()}  # other tests' pools

    def spy(path: str) -> StoredListing | None:
        workers_alive.append(len({p.pid for p in multiprocessing.active_children()} - before))
        return real(path)

    monkeypatch.setattr(writer, "open_stored", spy)
    config = WriteConfig(out=str(tmp_path / "out"), workers=2, executor="process")
    manifest = write(config, str(tmp_path / "listing"), progress=False).manifest
    assert workers_alive == [1]  # 2 workers: this process and one started before the listing
    assert manifest.records == len(listing.entries)


def test_never_more_worker_processes_than_shards(make_raw, tmp_path, monkeypatch):
    """--workers 8 over 5 files makes 5 shards: this process and 4 others, not 7."""
    write_listing(list_files(str(make_raw(5, 16))), str(tmp_path / "listing"))
    started = []
    real = writer.open_stored
    before = {p.pid for p in multiprocessing.active_children()}  # other tests' pools

    def spy(path: str) -> StoredListing | None:
        started.append(len({p.pid for p in multiprocessing.active_children()} - before))
        return real(path)

    pools = []
    real_pool = ProcessExecutor.__init__

    def pool_spy(self: ProcessExecutor, options: RunOptions, **kw: bool) -> None:
        pools.append(options.workers)
        real_pool(self, options, **kw)

    monkeypatch.setattr(writer, "open_stored", spy)
    monkeypatch.setattr(ProcessExecutor, "__init__", pool_spy)
    config = WriteConfig(out=str(tmp_path / "out"), workers=8, executor="process")
    manifest = write(config, str(tmp_path / "listing"), progress=False).manifest
    assert len(manifest.shards) == 5
    assert pools == [5]  # this process and 4 others
    # fork starts all 4 at once; forkserver (a parent with threads) only as tasks need them
    assert 1 <= started[0] <= 4


def test_plan_does_not_import_the_transform(listing, tmp_path):
    """The caller resolves the transform's identity; plan only uses it (a pure function)."""
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=2, transform="no_such_mod:fn")
    planned = plan.plan(listing, config, "no_such_mod:fn@0123456789abcdef")
    assert planned.params["transform"] == "no_such_mod:fn@0123456789abcdef"
    assert "no_such_mod" not in sys.modules and len(planned.tasks) == 2
    other = plan.plan(listing, config, "no_such_mod:fn@fedcba9876543210").version
    assert other != planned.version  # another module source, another version directory


def test_plan_refuses_an_identity_of_another_transform(listing, tmp_path):
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=2, transform="tx_mod:fn")
    with pytest.raises(
        ConfigError, match=r"expected the identity of transform 'tx_mod:fn', got 'none'"
    ):
        plan.plan(listing, config)


def test_a_manifest_copy_inside_the_shard_folder_is_refused_and_no_manifest_replaced(
    listing, tmp_path
):
    """`--manifest shards/<version>/manifest.json` of a write with other params replaced that
    finished version's manifest with the new version's (exit 0): it then read as the other."""
    out = tmp_path / "shards"
    first = write(WriteConfig(out=str(out), num_shards=2, executor="serial"), listing).manifest
    own = Path(first.directory) / MANIFEST_NAME
    before = own.read_bytes()
    config = WriteConfig(
        out=str(out), num_shards=2, seed=7, executor="serial", manifest_copy=str(own)
    )
    with pytest.raises(ConfigError) as refused:
        write(config, listing, progress=False)
    assert str(refused.value) == (
        f"manifest: expected a path outside the shard folder {out} (--out), found {own} "
        "inside it, where it would replace a version's own manifest; keep the copy beside "
        "that folder (data/manifest.json beside data/shards)"
    )
    assert own.read_bytes() == before and sorted(os.listdir(out)) == [first.fingerprint]
    args = ["write", str(tmp_path / "l"), "--out", str(out), "--manifest", str(own)]
    write_listing(listing, str(tmp_path / "l"))
    done = CliRunner().invoke(app, [*args, "--seed", "7", "--no-progress"])
    assert done.exit_code != 0 and "Traceback" not in done.output
    assert done.output.strip().splitlines()[-1].endswith("(data/manifest.json beside data/shards)")


def test_a_manifest_copy_over_another_sets_version_manifest_or_a_user_file_is_refused(
    listing, tmp_path
):
    """--manifest other_set/<version>/manifest.json replaced that version's own manifest
    (it read as the previous version first); --manifest notes.txt replaced the notes."""
    other = write(
        WriteConfig(out=str(tmp_path / "other"), num_shards=2, executor="serial"), listing
    )
    own = Path(other.manifest.directory) / MANIFEST_NAME
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for target, found in ((own, "the own manifest of version"), (notes, "a file that is no")):
        before = target.read_bytes()
        config = WriteConfig(
            out=str(tmp_path / "shards"), num_shards=2, seed=1, executor="serial",
            manifest_copy=str(target),
        )  # fmt: skip
        with pytest.raises(ConfigError, match=rf"manifest: expected a new file .*found {found}"):
            write(config, listing, progress=False)
        assert target.read_bytes() == before
    copy = tmp_path / "data" / "manifest.json"  # its own earlier copy: replaced, gone version too
    first = WriteConfig(
        out=str(tmp_path / "s2"), num_shards=2, executor="serial", manifest_copy=str(copy)
    )
    gone = write(first, listing).manifest
    shutil.rmtree(gone.directory)
    write(dataclasses.replace(first, seed=3, previous="none"), listing)
