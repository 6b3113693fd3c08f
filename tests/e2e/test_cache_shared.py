"""A limited cache over S3 (moto's server on 127.0.0.1) shared by processes: bounds, locks,
two trainings at once."""

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
from tfshards import storage
from tfshards.cachedir import ENV as CACHE_ENV
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_digits, write_synthetic
from tfshards.reading import loader, pins
from tfshards.reading.cache import ShardCache
from tfshards.reading.cachespace import LIMIT_ENV
from tfshards.shardset import manifest as manifests
from tfshards.shardset.layout import MANIFEST_NAME
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


@pytest.fixture
def digits_on_s3(tmp_path: Path, s3: dict[str, Any]) -> str:
    """The 1,797 8 px digits in 16 shards on S3; returns the manifest's URL."""
    write_digits(str(tmp_path / "digits"))
    config = WriteConfig(
        out="s3://bucket/digits", num_shards=16, executor="serial", seed=42, out_options=s3
    )
    manifest = write(config, list_files(str(tmp_path / "digits")), progress=False).manifest
    return storage.join(manifest.directory, MANIFEST_NAME)


# Two epochs at 8 px: the train split read in the epoch order, the val split interleaved.
TINY = {"image_size": 8, "epochs": 2, "batch_size": 64}
TIMINGS = {"examples_per_s", "input_bound_fraction", "seconds"}


# The train stage's work in a process of its own: argv[1] the config, argv[2] the metrics file.
_TRAIN = """
import json, sys
from tfshards.training.train import train
from tfshards.training.trainconfig import TrainConfig

train(TrainConfig(**{**json.loads(sys.argv[1]), "metrics": sys.argv[2]}))
"""


def _metrics(path: Path) -> dict[str, Any]:
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in TIMINGS}


def test_two_trainings_share_one_limited_cache(digits_on_s3, s3, tmp_path, monkeypatch):
    """Run concurrently as processes on a cache limited to 20% of the set, both give the
    metrics of a solo run with no limit."""
    from tfshards.training.train import train
    from tfshards.training.trainconfig import TrainConfig

    aws = {
        "AWS_ENDPOINT_URL": s3["endpoint_url"],  # read by botocore, so by s3fs
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    for key, value in aws.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "solo"))
    outputs = {"live_dir": None, "model_out": None, "split_out": None}
    solo = tmp_path / "solo.json"
    config = TrainConfig(manifest=digits_on_s3, **TINY, metrics=str(solo), **outputs)  # type: ignore[arg-type]
    train(config)
    manifest = manifests.load(digits_on_s3)
    cache_dir, limit = str(tmp_path / "shared"), manifest.bytes // 5
    env = {
        **os.environ,
        **aws,
        CACHE_ENV: cache_dir,
        LIMIT_ENV: str(limit),
        "PYTHONPATH": str(REPO / "src"),
    }
    argv = [sys.executable, "-c", _TRAIN, json.dumps({**config.settings(), **outputs})]
    with Sampler(cache_dir) as sampler:
        metrics = [str(tmp_path / f"{i}.json") for i in range(2)]
        children = [subprocess.Popen([*argv, m], env=env, cwd=tmp_path) for m in metrics]
        assert [child.wait(timeout=300) for child in children] == [0, 0]
    assert _metrics(tmp_path / "0.json") == _metrics(tmp_path / "1.json") == _metrics(solo)
    largest = max(s.bytes for s in manifest.shards)
    assert dir_bytes(cache_dir) <= limit + largest
    # Each process pins the shards its reader holds open; together they can hold more.
    print(f"two trainings: peak {sampler.peak} bytes, limit {limit}, largest shard {largest}")


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
