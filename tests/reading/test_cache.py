"""Remote shards are read through a verified local cache: fetched once, re-fetched when damaged."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from tfshards.cachedir import root as default_cache_dir
from tfshards.errors import ShardError
from tfshards.reading import cache as cache_module
from tfshards.reading import corruption, loader
from tfshards.reading.cache import SIDECAR, ShardCache
from tfshards.shardset.manifest import Manifest


@pytest.fixture
def remote(
    make_raw: Callable[..., Path], write_set: Callable[..., Manifest], tmp_path: Path
) -> Manifest:
    """60 synthetic 16 px JPEGs in 4 shards on memory://."""
    raw = make_raw(60, 16, classes=3, path=tmp_path / "img")
    return write_set(raw, "memory://bucket/shards", num_shards=4, executor="serial")


def _remote_path(manifest: Manifest, name: str) -> str:
    return manifest.shard_url(name).removeprefix("memory://")


def test_remote_shards_are_read_through_the_cache(remote, tmp_path):
    cache_dir = str(tmp_path / "cache")
    ds = loader.make_dataset(
        remote.shards, remote, batch_size=7, training=False, cache_dir=cache_dir, decode=False
    )
    assert sum(int(labels.shape[0]) for _, labels in ds) == 60
    cache = ShardCache(cache_dir)
    for shard in remote.shards:
        assert Path(cache.path(shard)).stat().st_size == shard.bytes
        assert json.loads(Path(cache.path(shard) + SIDECAR).read_text())["sha256"] == shard.sha256


def test_training_on_remote_shards_waits_for_each_download(remote, tmp_path):
    ds = loader.make_dataset(
        remote.shards,
        remote,
        batch_size=8,
        training=True,
        repeat=False,
        cache_dir=str(tmp_path / "cache"),
        features=["path"],
        decode=False,
    )
    seen = collections.Counter(p for features, _ in ds for p in features["path"].numpy().tolist())
    assert len(seen) == 60 and set(seen.values()) == {1}


def test_verified_copies_are_reused_without_the_remote(remote, tmp_path):
    cache = ShardCache(str(tmp_path / "cache"))
    cache.fetch_all(remote, remote.shards)
    for shard in remote.shards:
        MemoryFileSystem().rm(_remote_path(remote, shard.name))
    paths = cache.fetch_all(remote, remote.shards)
    assert paths == [cache.path(s) for s in remote.shards]


def test_tampered_copy_is_fetched_again(remote, tmp_path):
    cache = ShardCache(str(tmp_path / "cache"))
    cache.fetch_all(remote, remote.shards)
    shard = remote.shards[2]
    path = Path(cache.path(shard))
    good = path.read_bytes()
    bad = bytearray(good)
    bad[100] ^= 0x01  # same size, one bit: only the hash can tell
    path.write_bytes(bytes(bad))
    assert not cache.is_verified(shard)
    cache.fetch_all(remote, remote.shards)
    assert path.read_bytes() == good
    assert cache.is_verified(shard)


def test_partial_copy_is_fetched_again(remote, tmp_path):
    cache = ShardCache(str(tmp_path / "cache"))
    cache.fetch_all(remote, remote.shards)
    shard = remote.shards[0]
    path = Path(cache.path(shard))
    good = path.read_bytes()
    path.write_bytes(good[:-5])
    os.unlink(str(path) + SIDECAR)
    assert not cache.is_verified(shard)
    ds = loader.make_dataset(
        remote.shards,
        remote,
        batch_size=60,
        training=False,
        cache_dir=str(tmp_path / "cache"),
        features=["path"],
        decode=False,
    )
    seen = collections.Counter(p for features, _ in ds for p in features["path"].numpy().tolist())
    assert len(seen) == 60 and set(seen.values()) == {1}
    assert path.read_bytes() == good


def test_remote_shard_that_does_not_match_the_manifest_is_refused(remote, tmp_path):
    shard = remote.shards[1]
    fs = MemoryFileSystem()
    data = bytearray(fs.cat_file(_remote_path(remote, shard.name)))
    data[10] ^= 0xFF
    fs.pipe_file(_remote_path(remote, shard.name), bytes(data))
    cache = ShardCache(str(tmp_path / "cache"))
    wrong = rf"{shard.name}: sha256 mismatch: expected {shard.sha256}, found [0-9a-f]{{64}}$"
    with pytest.raises(ShardError, match=wrong):
        cache.fetch_all(remote, remote.shards)
    assert not Path(cache.path(shard)).exists()  # nothing unverified under a final name


def test_missing_remote_shard_names_it(remote, tmp_path):
    shard = remote.shards[3]
    MemoryFileSystem().rm(_remote_path(remote, shard.name))
    with pytest.raises(
        ShardError,
        match=rf"{shard.name}: missing: expected {shard.bytes} bytes holding {shard.records} "
        "records$",
    ):
        ShardCache(str(tmp_path / "cache")).fetch_all(remote, remote.shards)


def test_cache_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TFSHARDS_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == str(tmp_path / "c")
    monkeypatch.delenv("TFSHARDS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == str(tmp_path / "x" / "tfshards")


def test_cached_shard_that_the_manifest_vouches_for_is_walked_before_tensorflow_reads(
    remote, tmp_path
):
    from tfshards.errors import RecordError
    from tfshards.format import tfrecord

    shard = remote.shards[2]
    fs = MemoryFileSystem()
    clean = fs.cat_file(_remote_path(remote, shard.name))
    hostile = (tfrecord.header(1 << 36) + clean[12:])[: len(clean)]  # a 64 GiB length, valid CRC
    fs.pipe_file(_remote_path(remote, shard.name), hostile)
    forged = dataclasses.replace(
        remote,
        shards=tuple(
            dataclasses.replace(s, sha256=hashlib.sha256(hostile).hexdigest())
            if s.name == shard.name
            else s
            for s in remote.shards
        ),
    )
    cache_dir = str(tmp_path / "cache")
    expected = (
        f"{forged.shard_url(shard)}: record 0 at byte 0: truncated record: "
        f"length field says {1 << 36} bytes + 4 CRC bytes, file has {len(clean) - 12} left"
    )
    with pytest.raises(RecordError) as info, corruption.shard_errors(forged, cache_dir=cache_dir):
        for _ in loader.make_dataset(
            forged.shards, forged, batch_size=8, training=False, cache_dir=cache_dir, decode=False
        ):
            pass
    assert str(info.value) == expected


@pytest.fixture
def on_s3(make_raw: Callable[..., Path], write_set: Callable[..., Manifest], tmp_path, s3):
    """24 synthetic 16 px JPEGs in 3 shards on moto's S3 server; with its storage options."""
    raw = make_raw(24, 16, classes=2, path=tmp_path / "img")
    out = "s3://bucket/shards"
    return write_set(raw, out, num_shards=3, executor="serial", out_options=s3), s3


@pytest.mark.parametrize("chunk", [None, 1000, "exact"])
def test_a_download_is_ranged_gets_with_no_head_request(on_s3, tmp_path, monkeypatch, chunk):
    import s3fs

    manifest, options = on_s3
    shard = manifest.shards[0]
    if chunk is not None:  # several ranges; "exact": the shard is one whole range
        monkeypatch.setattr(cache_module, "CHUNK_BYTES", shard.bytes if chunk == "exact" else chunk)

    def no_head(*args, **kwargs):
        raise AssertionError("a download asked for the object's size")

    monkeypatch.setattr(s3fs.S3FileSystem, "_info", no_head)
    cache = ShardCache(str(tmp_path / "cache"))
    paths = cache.fetch_all(manifest, manifest.shards, **options)
    for path, s in zip(paths, manifest.shards, strict=True):
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == s.sha256


@pytest.mark.parametrize("change", [-7, 1, 70_000])
def test_a_remote_shard_of_another_size_is_refused_with_its_size(
    remote, tmp_path, monkeypatch, change
):
    monkeypatch.setattr(cache_module, "CHUNK_BYTES", 4096)
    shard = remote.shards[2]
    fs = MemoryFileSystem()
    data = fs.cat_file(_remote_path(remote, shard.name))
    fs.pipe_file(
        _remote_path(remote, shard.name), data[:change] if change < 0 else data + b"x" * change
    )
    cache = ShardCache(str(tmp_path / "cache"))
    found = shard.bytes + change
    with pytest.raises(
        ShardError,
        match=rf"{shard.name}: size mismatch: expected {shard.bytes} bytes, found {found}",
    ):
        cache.fetch_all(remote, remote.shards)
    assert not Path(cache.path(shard)).exists()


@pytest.mark.parametrize("keep", [0, 1500, 2000, 2001])  # empty, inside a range, at its end, past
def test_a_shorter_shard_on_s3_is_refused_with_its_size(on_s3, tmp_path, monkeypatch, keep):
    import s3fs

    manifest, options = on_s3
    monkeypatch.setattr(cache_module, "CHUNK_BYTES", 1000)
    shard = manifest.shards[1]
    fs = s3fs.S3FileSystem(**options)
    url = manifest.shard_url(shard)
    fs.pipe_file(url, fs.cat_file(url)[:keep])
    cache = ShardCache(str(tmp_path / "cache"))
    wrong = rf"{shard.name}: size mismatch: expected {shard.bytes} bytes, found {keep}"
    with pytest.raises(ShardError, match=wrong):
        cache.fetch_all(manifest, [shard], **options)


def test_a_folder_where_a_copy_goes_is_one_line_and_leaves_no_part_file(remote, tmp_path):
    cache = ShardCache(str(tmp_path / "cache"))
    shard = remote.shards[0]
    Path(cache.path(shard)).mkdir(parents=True)
    with pytest.raises(
        ShardError, match=rf"{shard.sha256}\.tfrecord: cannot place the verified copy"
    ):
        cache.fetch_all(remote, [shard])
    assert not [p for p in (tmp_path / "cache").iterdir() if ".part" in p.name]
    assert Path(cache.path(shard)).is_dir()  # not the cache's file: left alone
