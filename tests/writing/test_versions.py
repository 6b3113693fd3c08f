"""Version directories named by content; files changed after listing; only shards match globs."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tfshards.errors import InputError
from tfshards.listing.listing import (
    Listing,
    contenthash,
    list_files,
    listing_digest,
    read_listing,
    write_listing,
)
from tfshards.shardset import layout
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest
from tfshards.writing import plan
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write


@pytest.fixture
def raw(make_raw: Callable[..., Path]) -> Path:
    return make_raw(60, 16)


def _version(listing: Listing, **kw: object) -> str:
    config = WriteConfig(out="shards", num_shards=3, **kw)  # type: ignore[arg-type]
    return plan.plan(listing, config).version


def _copy_without_mtimes(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, copy_function=shutil.copyfile)  # bytes only: new mtimes
    for path in dst.rglob("*"):
        os.utime(path, (1_000_000_000, 1_000_000_000))  # and certainly other ones


def test_local_tokens_are_the_sha256_of_each_file(raw: Path, loop: str) -> None:
    listing = list_files(str(raw))
    for entry in listing.entries:
        data = (raw / entry.path).read_bytes()
        assert entry.token == f"sha256:{hashlib.sha256(data).hexdigest()}"
        assert entry.size == len(data)


def test_a_copy_elsewhere_with_new_mtimes_gets_the_same_name_and_listing(
    raw: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "somewhere" / "else" / "raw"
    _copy_without_mtimes(raw, copy)
    here, there = list_files(str(raw)), list_files(str(copy))
    assert listing_digest(here) == listing_digest(there)
    assert _version(here) == _version(there)
    write_listing(here, str(tmp_path / "l1"))
    write_listing(there, str(tmp_path / "l2"))
    assert (tmp_path / "l1/files.jsonl").read_bytes() == (tmp_path / "l2/files.jsonl").read_bytes()


def test_absolute_and_relative_roots_give_the_same_name(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spellings = [str(raw), "raw", "./raw/", f"{tmp_path}/./raw"]
    names = {_version(list_files(root)) for root in spellings}
    assert len(names) == 1


def test_same_size_content_change_and_write_params_change_the_name(raw: Path) -> None:
    before = list_files(str(raw))
    assert _version(before, seed=1) != _version(before, seed=2)
    target = raw / before.entries[7].path
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    after = list_files(str(raw))
    assert [e.size for e in after.entries] == [e.size for e in before.entries]
    assert _version(after) != _version(before)


def test_a_new_bytes_version_changes_the_name(raw: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listing = list_files(str(raw))
    old = _version(listing)
    monkeypatch.setattr(plan, "BYTES_VERSION", plan.BYTES_VERSION + 1)
    assert _version(listing) != old


def _rewrite_same_size_and_mtime(path: Path) -> tuple[str, str]:
    """Flip one byte and put the old mtime back; returns (old sha256, new sha256)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    old = hashlib.sha256(data).hexdigest()
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    return old, hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("transform", [False, True])
def test_bytes_changed_after_listing_fail_naming_the_file_and_both_hashes(
    raw: Path, tmp_path: Path, loop: str, transform: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing = list_files(str(raw))
    rel = listing.entries[11].path
    old, new = _rewrite_same_size_and_mtime(raw / rel)
    spec = None
    if transform:  # the per-file path a transform takes
        (tmp_path / "tx_same.py").write_text("def same(path, data, label):\n    return {}\n")
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        spec = "tx_same:same"
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=3, executor="serial", transform=spec)
    with pytest.raises(InputError) as info:
        write(config, listing, progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        f"{raw}/{rel}: file changed since it was listed: expected sha256 {old}, found {new}"
    )
    assert not list((tmp_path / "out").glob(f"*/{MANIFEST_NAME}"))


def test_bytes_changed_after_listing_are_rejected_with_skip(
    raw: Path, tmp_path: Path, loop: str
) -> None:
    listing = list_files(str(raw))
    rel = listing.entries[5].path
    old, new = _rewrite_same_size_and_mtime(raw / rel)
    config = WriteConfig(
        out=str(tmp_path / "out"), num_shards=3, executor="serial", on_error="skip"
    )
    manifest = write(config, listing, progress=False).manifest
    assert [(r.path, r.reason) for r in manifest.rejected] == [
        (rel, f"file changed since it was listed: expected sha256 {old}, found {new}")
    ]
    assert manifest.records == len(listing.entries) - 1
    for shard in manifest.shards:
        assert rel.encode() not in Path(manifest.shard_url(shard)).read_bytes()


def test_remote_md5_tokens_are_checked_and_multipart_etags_are_not() -> None:
    md5 = hashlib.md5(b"abc").hexdigest()
    assert contenthash.storage_token({"ETag": f'"{md5}"'}) == f"etag:{md5}"
    assert contenthash.expected_md5(f"etag:{md5}") == md5
    assert contenthash.expected_md5(f"etag:{md5}-3") is None  # multipart: part-size dependent
    assert contenthash.storage_token({"created": 12.5, "size": 3}) == ""  # a time is no content


@pytest.mark.slow
def test_an_s3_object_replaced_after_listing_is_caught_by_its_etag(raw, tmp_path, endpoint):
    import s3fs

    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    fs.mkdir("etag-bucket")
    try:
        fs.put(f"{raw}/", "etag-bucket/raw/", recursive=True)
        listing = list_files("s3://etag-bucket/raw", storage_options=options)
        rel = listing.entries[3].path
        assert listing.entries[3].token.startswith("etag:")
        data = bytearray(fs.cat_file(f"etag-bucket/raw/{rel}"))
        old = hashlib.md5(data).hexdigest()
        data[-2] ^= 0x33
        fs.pipe_file(f"etag-bucket/raw/{rel}", bytes(data))  # same size, new bytes
        config = WriteConfig(
            out=str(tmp_path / "out"), num_shards=2, executor="serial", source_options=options
        )
        with pytest.raises(InputError) as info:
            write(config, listing, progress=False)
        assert str(info.value) == (
            f"s3://etag-bucket/raw/{rel}: file changed since it was listed: expected md5 "
            f"{old}, found {hashlib.md5(data).hexdigest()}"
        )
    finally:
        fs.rm("etag-bucket", recursive=True)
        s3fs.S3FileSystem.clear_instance_cache()


def _tf_count(pattern: str) -> int:
    import tensorflow as tf

    files = tf.io.gfile.glob(pattern)
    return sum(1 for _ in tf.data.TFRecordDataset(files))


def test_shard_globs_match_shards_only_and_read_every_record_after_a_resume(
    raw: Path, tmp_path: Path
) -> None:
    listing = list_files(str(raw))
    config = WriteConfig(out=str(tmp_path / "out"), name="digits", num_shards=4, executor="serial")
    first = write(config, listing, progress=False).manifest
    version = Path(first.root)
    # An interrupted run: no manifest, one shard gone, a dead writer's temp file left.
    (version / MANIFEST_NAME).unlink()
    (version / first.shards[2].name).unlink()
    dead = version / layout.WORK_DIR / f".{first.shards[2].name}.tmp-host-999999-0123abcd"
    dead.write_bytes(b"partial")
    again = write(config, listing, progress=False)
    assert again.reused == 3 and again.manifest == first
    shards = sorted(str(version / s.name) for s in first.shards)
    for pattern in ("digits-*", "digits-*-of-*", "*.tfrecord*"):
        assert sorted(glob.glob(str(version / pattern))) == shards, pattern
        assert _tf_count(str(version / pattern)) == first.records == 60, pattern
    leftover = sorted(p.name for p in version.iterdir())
    top = [MANIFEST_NAME, layout.WORK_DIR, layout.INDEX.folder, layout.RECORDS.folder]
    top += [*layout.TFDS_FILES, layout.STATS.folder, layout.IMAGESTATS_NAME]
    assert leftover == sorted([*top, *(s.name for s in first.shards)])


def test_validate_uses_the_layout_declaration(raw: Path, tmp_path: Path) -> None:
    from tfshards.validation.validate import ValidateConfig, validate

    config = WriteConfig(out=str(tmp_path / "out"), num_shards=2, executor="serial")
    manifest = write(config, listing := list_files(str(raw)), progress=False).manifest
    version = Path(manifest.root)
    assert validate(ValidateConfig(str(version / MANIFEST_NAME))).ok
    (version / layout.WORK_DIR / "notes.txt").write_text("x")
    (version / "extra").mkdir()
    (version / "extra" / "a.bin").write_bytes(b"")
    report = validate(ValidateConfig(str(version / MANIFEST_NAME)))
    assert sorted(str(p) for p in report.problems) == [
        "_work/notes.txt: file not listed in the manifest",
        "extra: directory not listed in the manifest",
    ]
    assert len(listing.entries) == manifest.records


def test_an_old_listing_is_refused_with_its_version(raw: Path, tmp_path: Path) -> None:
    write_listing(list_files(str(raw)), str(tmp_path / "l"))
    meta = tmp_path / "l" / "meta.json"
    meta.write_text(meta.read_text().replace('"version": 2', '"version": 1'))
    with pytest.raises(InputError, match="listing version 2 expected, found 1"):
        read_listing(str(tmp_path / "l"))


def test_manifest_round_trips(raw: Path, tmp_path: Path) -> None:
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=2, executor="serial")
    manifest = write(config, list_files(str(raw)), progress=False).manifest
    assert Manifest.from_json(manifest.to_json()) == manifest
