"""Leakage across two shard sets mixed for training, found from member lists alone."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.reading.lookup import Version
from tfshards.shardset import crossleaks
from tfshards.shardset import split as splits
from tfshards.shardset.manifest import Manifest, ShardInfo
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

COPIED = 12  # files of set 0 copied into set 1 (same bytes, other names)


def _write(raw: Path, out: Path) -> Manifest:
    config = WriteConfig(out=str(out), num_shards=8, workers=1, executor="serial", buckets=8)
    return write(config, list_files(str(raw)), progress=False).manifest


def _two_sets(tmp_path: Path) -> tuple[Manifest, Manifest]:
    """40 and 30 synthetic PNGs (other seeds), and 12 of the first set's files in the second."""
    write_synthetic(str(tmp_path / "a"), 40, 8, fmt="png", classes=4, seed=0, workers=1)
    write_synthetic(str(tmp_path / "b"), 30, 8, fmt="png", classes=4, seed=1, workers=1)
    for path in sorted((tmp_path / "a").rglob("*.png"))[:COPIED]:
        shutil.copyfile(path, tmp_path / "b" / path.parent.name / f"copy-{path.name}")
    return _write(tmp_path / "a", tmp_path / "sa"), _write(tmp_path / "b", tmp_path / "sb")


def _payloads(manifest: Manifest, shards: tuple[ShardInfo, ...]) -> dict[bytes, str]:
    """Each record's stored sha256 feature -> its path, read from the records themselves."""
    version = Version(manifest)
    found = {}
    for shard in shards:
        for index in range(shard.records):
            record = version.read(shard, index)
            found[bytes(record.features["sha256"][1][0])] = record.path
    return found


def test_a_file_one_set_trains_on_and_another_validates_on_is_each_counted(tmp_path: Path):
    a, b = _two_sets(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", splits.SplitWarning)
        parts = [splits.split(a, 0.5, seed=3), splits.split(b, 0.5, seed=3)]
    train = [(m, p.train) for m, p in zip((a, b), parts, strict=True)]
    val = [(m, p.val) for m, p in zip((a, b), parts, strict=True)]

    found = crossleaks.find(train, val, examples=100)

    # The same count from the records' own sha256 features, read back from the shards.
    trained = [_payloads(m, p.train) for m, p in zip((a, b), parts, strict=True)]
    validated = [_payloads(m, p.val) for m, p in zip((a, b), parts, strict=True)]
    expected = {
        (i, path, 1 - i, validated[1 - i][sha])
        for i in (0, 1)
        for sha, path in trained[i].items()
        if sha in validated[1 - i]
    }
    assert 0 < len(expected) <= COPIED
    assert found.count == len(expected)
    assert {(k.train_set, k.train_path, k.val_set, k.val_path) for k in found.examples} == expected
    first = found.examples[0]
    assert first.line() == (
        f"set {first.train_set} trains on {first.train_path}, "
        f"which set {first.val_set} validates on as {first.val_path}"
    )


def test_a_set_whose_own_sides_share_a_file_is_not_a_cross_leak(tmp_path: Path):
    a, _ = _two_sets(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", splits.SplitWarning)
        part = splits.split(a, 0.5, seed=3)
    assert crossleaks.find([(a, part.train)], [(a, part.val)]).count == 0
    # Validating set 0 against itself as a second set finds nothing of its own train side.
    found = crossleaks.find([(a, part.train), (a, ())], [(a, part.val), (a, part.val)])
    assert found.count == 0


def test_examples_are_capped_but_every_leak_counted(tmp_path: Path):
    a, _ = _two_sets(tmp_path)
    # Set 1 validates on all of set 0: every record of set 0's train side leaks.
    found = crossleaks.find([(a, a.shards), (a, ())], [(a, ()), (a, a.shards)], examples=3)
    assert found.count == a.records and len(found.examples) == 3
