"""A limited cache over S3 (moto's server on 127.0.0.1) shared by processes: bounds, locks."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cachesize import Sampler, dir_bytes
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.reading import loader, pins
from tfshards.reading.cache import ShardCache
from tfshards.reading.cachespace import LIMIT_ENV
from tfshards.shardset.manifest import Manifest
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def on_s3(tmp_path: Path, s3: dict[str, Any]) -> Manifest:
    """240 synthetic 16 px JPEGs in 40 shards on S3."""
    write_synthetic(str(tmp_path / "raw"), 240, 16, workers=1)
    config = WriteConfig(out="s3://bucket/shards", num_shards=40, executor="serial", out_options=s3)
    manifest = write(config, list_files(str(tmp_path / "raw")), progress=False).manifest
    (tmp_path / "manifest.json").write_bytes(manifest.to_json())
    return manifest


_READ = """
import collections, json, sys
from tfshards.reading import loader
from tfshards.shardset.manifest import Manifest

manifest = Manifest.from_json(open(sys.argv[1], "rb").read())
options = json.loads(sys.argv[3])
ds = loader.make_dataset(
    manifest.shards, manifest, batch_size=8, training=False, repeat=False, cycle_length=2,
    cache_dir=sys.argv[2], features=["path"], decode=False, storage_options=options,
)
seen = collections.Counter()
for _ in range(2):
    for features, _ in ds:
        seen.update(p.decode() for p in features["path"].numpy().tolist())
print(json.dumps(seen))
"""


def _read_in_process(manifest: Manifest, cache_dir: str, s3: dict[str, Any]) -> dict[str, int]:
    ds = loader.make_dataset(
        manifest.shards,
        manifest,
        batch_size=8,
        training=False,
        repeat=False,
        cycle_length=2,
        cache_dir=cache_dir,
        features=["path"],
        decode=False,
        storage_options=s3,
    )
    seen: collections.Counter[str] = collections.Counter()
    for _ in range(2):
        for features, _ in ds:
            seen.update(p.decode() for p in features["path"].numpy().tolist())
    return dict(seen)


def test_two_processes_share_one_limited_cache(on_s3, s3, tmp_path, monkeypatch):
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    solo = _read_in_process(on_s3, str(tmp_path / "solo"), s3)
    assert sum(solo.values()) == 2 * on_s3.records
    cache_dir = str(tmp_path / "shared")
    limit = on_s3.bytes // 5
    env = {**os.environ, LIMIT_ENV: str(limit), "PYTHONPATH": str(REPO / "src")}
    argv = [sys.executable, "-c", _READ, str(tmp_path / "manifest.json"), cache_dir, json.dumps(s3)]
    with Sampler(cache_dir) as sampler:
        children = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE) for _ in range(2)]
        outs = [child.communicate(timeout=300)[0] for child in children]
    assert [child.returncode for child in children] == [0, 0]
    for out in outs:
        assert json.loads(out.decode().splitlines()[-1]) == solo
    largest = max(s.bytes for s in on_s3.shards)
    assert dir_bytes(cache_dir) <= limit + largest
    # Each process pins the shards its reader holds open; together they can hold more.
    print(f"two processes: peak {sampler.peak} bytes, limit {limit}, largest shard {largest}")


def test_three_training_epochs_over_s3_stay_under_the_limit_plus_one_shard(
    on_s3, s3, tmp_path, monkeypatch
):
    limit = on_s3.bytes // 5
    monkeypatch.setenv(LIMIT_ENV, str(limit))
    cache_dir = str(tmp_path / "cache")
    ds = loader.make_dataset(
        on_s3.shards,
        on_s3,
        batch_size=8,
        training=True,
        cycle_length=2,
        cache_dir=cache_dir,
        features=["path"],
        decode=False,
        storage_options=s3,
    )
    seen: collections.Counter[bytes] = collections.Counter()
    with Sampler(cache_dir) as sampler:
        for features, _ in ds.take(3 * on_s3.records // 8):
            seen.update(features["path"].numpy().tolist())
    assert len(seen) == on_s3.records and set(seen.values()) == {3}
    assert sampler.peak <= limit + max(s.bytes for s in on_s3.shards)


# Downloads one shard with every write slowed by argv[4] seconds (a slow link), into a
# limited cache; prints "done" once it is in place.
_SLOW_FETCH = """
import json, os, sys, time
from tfshards.reading.cache import ShardCache
from tfshards.shardset.manifest import Manifest

manifest = Manifest.from_json(open(sys.argv[1], "rb").read())
write = os.write
os.write = lambda fd, data: (time.sleep(float(sys.argv[4])), write(fd, data))[1]
cache = ShardCache(sys.argv[2], limit="1G")
shard = manifest.shards[0]
cache.fetch(manifest, [shard], **json.loads(sys.argv[3])).wait(cache.path(shard))
print("done", cache.downloads, flush=True)
"""


def _slow_child(tmp_path: Path, cache_dir: str, s3: dict[str, Any], delay: float) -> Any:
    argv = [sys.executable, "-c", _SLOW_FETCH, str(tmp_path / "manifest.json"), cache_dir]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen([*argv, json.dumps(s3), str(delay)], env=env, stdout=subprocess.PIPE)


def _part_appears(cache_dir: str, child: Any) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.poll() is None:
        names = os.listdir(cache_dir) if os.path.isdir(cache_dir) else []
        parts = [n for n in names if ".part-" in n]
        if parts:
            return parts[0]
        time.sleep(0.005)
    raise AssertionError("the child never started its download")


def test_a_shard_another_process_is_downloading_is_waited_for(on_s3, s3, tmp_path):
    cache_dir = str(tmp_path / "cache")
    child = _slow_child(tmp_path, cache_dir, s3, 2.0)
    _part_appears(cache_dir, child)
    cache = ShardCache(cache_dir, limit="1G")
    shard = on_s3.shards[0]
    path = cache.fetch(on_s3, [shard], **s3).wait(cache.path(shard))  # no error, no download
    assert child.poll() is None or child.returncode == 0
    assert cache.downloads == 0 and cache.is_verified(shard)
    pins.release(path)
    assert child.communicate(timeout=60)[0].decode().split() == ["done", "1"]


def test_a_killed_download_leaves_no_partial_shard(on_s3, s3, tmp_path):
    cache_dir = str(tmp_path / "cache")
    child = _slow_child(tmp_path, cache_dir, s3, 30.0)
    part = _part_appears(cache_dir, child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    shard = on_s3.shards[0]
    cache = ShardCache(cache_dir, limit="1G")
    assert not os.path.exists(cache.path(shard))  # only the part file, under its own name
    assert part in os.listdir(cache_dir)
    path = cache.fetch(on_s3, [shard], **s3).wait(cache.path(shard))
    assert cache.downloads == 1 and cache.is_verified(shard)
    assert part not in os.listdir(cache_dir)  # a dead process's part file is removed
    pins.release(path)
