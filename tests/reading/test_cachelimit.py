"""A limited cache: LRU eviction under the limit, pins that eviction skips, a shared directory."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cachesize import Sampler, dir_bytes
from tfshards.errors import ConfigError, ShardError
from tfshards.reading import epochorder, loader, pins
from tfshards.reading.cache import ShardCache
from tfshards.reading.cachespace import LIMIT_ENV, parse_limit
from tfshards.shardset.manifest import Manifest


@pytest.fixture
def remote(
    make_raw: Callable[..., Path], write_set: Callable[..., Manifest], tmp_path: Path
) -> Manifest:
    """240 synthetic 16 px JPEGs in 40 shards on memory://."""
    raw = make_raw(240, 16, classes=4, path=tmp_path / "img")
    return write_set(raw, "memory://bucket/shards", num_shards=40, executor="serial")


@pytest.fixture
def limited(monkeypatch: pytest.MonkeyPatch, remote: Manifest) -> Iterator[int]:
    """``$TFSHARDS_CACHE_LIMIT`` at 20% of the set's bytes; yields the limit."""
    limit = remote.bytes // 5
    monkeypatch.setenv(LIMIT_ENV, str(limit))
    yield limit


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", None), ("4096", 4096), ("10K", 10 << 10), ("1.5M", 3 << 19), ("2G", 2 << 30)],
)
def test_limit_takes_bytes_with_a_suffix(text, expected):
    assert parse_limit(text) == expected
    assert parse_limit("2gib") == 2 << 30


@pytest.mark.parametrize("text", ["-1", "G", "ten", "0"])
def test_limit_that_is_no_size_is_refused(text):
    with pytest.raises(ConfigError, match="cache limit"):
        parse_limit(text)


def test_limit_comes_from_the_environment(monkeypatch, tmp_path):
    assert ShardCache(str(tmp_path)).limit is None
    monkeypatch.setenv(LIMIT_ENV, "3M")
    assert ShardCache(str(tmp_path)).limit == 3 << 20
    assert ShardCache(str(tmp_path), limit="1K").limit == 1024


def _paths(ds, steps: int) -> collections.Counter[bytes]:
    seen: collections.Counter[bytes] = collections.Counter()
    for features, _ in ds.take(steps):
        seen.update(features["path"].numpy().tolist())
    return seen


def test_three_training_epochs_stay_under_the_limit_plus_one_shard(remote, limited, tmp_path):
    cache_dir = str(tmp_path / "cache")
    ds = loader.make_dataset(
        remote.shards,
        remote,
        batch_size=8,
        training=True,
        cycle_length=2,
        cache_dir=cache_dir,
        features=["path"],
        decode=False,
    )
    with Sampler(cache_dir) as sampler:
        seen = _paths(ds, 3 * remote.records // 8)
    assert len(seen) == remote.records and set(seen.values()) == {3}
    largest = max(s.bytes for s in remote.shards)
    assert sampler.samples > 100
    assert 0 < sampler.peak <= limited + largest, (sampler.peak, limited, largest)


def test_repeated_passes_in_order_stay_under_the_limit_plus_one_shard(remote, limited, tmp_path):
    cache_dir = str(tmp_path / "cache")
    ds = loader.make_dataset(
        remote.shards,
        remote,
        batch_size=10,
        training=False,
        repeat=True,
        cycle_length=2,
        cache_dir=cache_dir,
        features=["path"],
        decode=False,
    )
    with Sampler(cache_dir) as sampler:
        seen = _paths(ds, 3 * remote.records // 10)
    assert len(seen) == remote.records and set(seen.values()) == {3}
    assert sampler.peak <= limited + max(s.bytes for s in remote.shards)
    assert dir_bytes(cache_dir) <= limited + max(s.bytes for s in remote.shards)


def test_a_pinned_shard_is_never_evicted(remote, tmp_path):
    cache_dir = str(tmp_path / "cache")
    one = max(s.bytes for s in remote.shards) + 200  # a shard and its sidecar
    first, other = ShardCache(cache_dir, limit=one), ShardCache(cache_dir, limit=one)
    fetch = first.fetch(remote, remote.shards[:1])
    held = fetch.wait(first.path(remote.shards[0]))
    assert pins.holds(held) == 1
    rest = other.fetch(remote, remote.shards[1:4])
    for shard in remote.shards[1:4]:
        path = rest.wait(other.path(shard))
        assert os.path.exists(held) and os.path.exists(path)
        pins.release(path)
    assert other.space.evicted == 2  # shards 1 and 2 went for 2 and 3; the pinned one stayed
    pins.release(held)
    again = other.fetch(remote, remote.shards[4:5])
    pins.release(again.wait(other.path(remote.shards[4])))
    assert not os.path.exists(held)  # unpinned and least recently used: evicted


def test_closing_a_fetch_undoes_its_pins(remote, tmp_path):
    cache = ShardCache(str(tmp_path / "cache"), limit="1G")
    fetch = cache.fetch(remote, remote.shards[:3])
    paths = [fetch.wait(cache.path(s)) for s in remote.shards[:3]]
    assert [pins.holds(p) for p in paths] == [1, 1, 1]
    fetch.close()  # type: ignore[attr-defined]
    assert [pins.holds(p) for p in paths] == [0, 0, 0]


def test_two_caches_on_one_directory_download_each_shard_once(remote, tmp_path):
    cache_dir = str(tmp_path / "cache")
    caches = [ShardCache(cache_dir, limit="1G", workers=4) for _ in range(2)]

    def read_all(cache: ShardCache) -> None:
        fetch = cache.fetch(remote, remote.shards)
        for shard in remote.shards:
            pins.release(fetch.wait(cache.path(shard)))

    threads = [threading.Thread(target=read_all, args=(c,)) for c in caches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(c.downloads for c in caches) == len(remote.shards)


def test_limited_cache_refuses_a_remote_shard_that_does_not_match(remote, tmp_path):
    from fsspec.implementations.memory import MemoryFileSystem

    shard = remote.shards[1]
    path = remote.shard_url(shard).removeprefix("memory://")
    fs = MemoryFileSystem()
    fs.pipe_file(path, fs.cat_file(path) + b"x")
    cache = ShardCache(str(tmp_path / "cache"), limit="1G")
    with pytest.raises(ShardError, match=f"{shard.name}: size mismatch"):
        cache.fetch(remote, [shard]).wait(cache.path(shard))
    assert os.listdir(cache.directory) == [".lock", ".locks"]  # no part file, no shard


def _appears(path: str, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.01)
    return False


def test_lookahead_follows_the_plan_within_the_limit(remote, tmp_path):
    shards = remote.shards
    three = sum(s.bytes for s in (shards[5], shards[2], shards[7])) + 3 * 256
    spare = max(s.bytes for s in shards)  # a lookahead leaves room for a shard asked for now
    cache = ShardCache(str(tmp_path / "cache"), limit=three + spare)
    fetch = cache.fetch(remote, shards)
    plan = [cache.path(shards[i]) for i in (5, 2, 7, 1)]
    fetch.expect(plan)
    held = fetch.wait(plan[0])  # pinned: the limit holds it and the next two
    assert _appears(plan[1]) and _appears(plan[2])  # brought ahead, never waited for
    time.sleep(0.2)
    assert not os.path.exists(plan[3])  # no room left but a shard needed before it
    assert not os.path.exists(cache.path(shards[0]))  # not in the plan
    assert cache.downloads == 3
    pins.release(held)
    for path in plan[1:]:
        pins.release(fetch.wait(path))
    assert cache.downloads == 4


def test_windows_of_shards_cut_in_units_let_every_pin_go(remote, limited, tmp_path, monkeypatch):
    """Shards of several units, windows of several shards: each window pins a shard once."""
    monkeypatch.setattr(epochorder, "UNIT_BYTES", max(s.bytes for s in remote.shards) // 3)
    cache_dir = str(tmp_path / "cache")
    ds = loader.make_dataset(
        remote.shards,
        remote,
        batch_size=8,
        training=True,
        shuffle_buffer=40,  # windows of ~40 records: ~1/6 of the set
        cache_dir=cache_dir,
        features=["path"],
        decode=False,
    )
    batches = iter(ds.take(3 * remote.records // 8))
    seen: collections.Counter[bytes] = collections.Counter()
    with Sampler(cache_dir) as sampler:
        for features, _ in batches:
            seen.update(features["path"].numpy().tolist())
            paths = [os.path.join(cache_dir, s.sha256 + ".tfrecord") for s in remote.shards]
            assert max(pins.holds(p) for p in paths) <= 1
    assert len(seen) == remote.records and set(seen.values()) == {3}
    assert sampler.peak <= limited + max(s.bytes for s in remote.shards)
