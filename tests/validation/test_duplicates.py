"""Duplicate payloads: found by stored sha256 within a set and across the training split."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.format import tfrecord
from tfshards.format.exampleparser import decode
from tfshards.project.sample import write_synthetic
from tfshards.shardset import split as splits
from tfshards.shardset.manifest import load
from tfshards.validation.duplicates import DigestStore, find_duplicates
from tfshards.validation.validate import ValidateConfig, validate


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def test_repeats_are_counted_within_and_across_the_split():
    first = _digest("a") + _digest("b") + _digest("c")
    second = _digest("x") + _digest("a")
    third = _digest("b") + _digest("y") + _digest("b")
    found = find_duplicates(["s0", "s1", "s2"], [first, second, third], val={"s1"})
    # "a" twice (s0 train, s1 val): across; "b" three times, all in training.
    assert found.metrics() == {"across_splits": 1, "groups": 2, "label_conflicts": 0, "records": 3}
    assert [(d.first, d.second, d.across_splits) for d in found.examples] == [
        (("s0", 0), ("s1", 1), True),
        (("s0", 1), ("s2", 0), False),
    ]
    assert str(found.examples[0]).startswith(
        f"s0: record 0: same payload (sha256 {_digest('a').hex()[:16]}"
    )


def test_unread_digests_match_nothing_and_distinct_payloads_find_nothing():
    zeros = bytes(32 * 3)
    found = find_duplicates(["s0", "s1"], [zeros, _digest("a") + _digest("b")], val={"s1"})
    assert found.metrics() == {"across_splits": 0, "groups": 0, "label_conflicts": 0, "records": 0}
    assert found.examples == ()


def test_digests_sharing_their_first_8_bytes_are_told_apart():
    a, b = bytes(8) + b"\x01" * 24, bytes(8) + b"\x02" * 24
    found = find_duplicates(["s0", "s1"], [a + b + a, b + a], val={"s1"})
    assert found.metrics() == {"across_splits": 2, "groups": 2, "label_conflicts": 0, "records": 3}
    assert {(d.first, d.second) for d in found.examples} == {
        (("s0", 0), ("s1", 1)),
        (("s0", 1), ("s1", 0)),
    }


def test_examples_are_bounded_and_cross_split_pairs_come_first():
    train = b"".join(_digest(f"t{i}") * 2 for i in range(30))
    val = _digest("t29")
    found = find_duplicates(["a", "b"], [train, val], val={"b"}, limit=5)
    assert found.metrics() == {
        "across_splits": 1,
        "groups": 30,
        "label_conflicts": 0,
        "records": 31,
    }
    assert len(found.examples) == 5 and found.examples[0].across_splits
    assert found.examples[0].second == ("b", 0)


def test_spilled_digests_find_what_held_digests_find_whatever_the_arrival_order() -> None:
    rng = np.random.default_rng(7)
    pool = rng.integers(0, 256, size=(3000, 32), dtype=np.uint8)
    pool[:40, :8] = 0  # some digests share their first 8 bytes
    pool[0] = 0  # an unread digest: matches nothing
    shards = [pool[rng.integers(0, len(pool), size=n)].tobytes() for n in (900, 1, 0, 1500, 700)]
    names = [f"s{k}" for k in range(len(shards))]
    held = find_duplicates(names, shards, val={"s1", "s3"})
    assert held.groups > 100 and held.across_splits > 10
    with DigestStore(names, {"s1", "s3"}, 3100, spill_records=0, bucket_records=100) as store:
        assert store.bits == 5  # 32 spill files
        for k in (3, 0, 4, 2, 1):
            store.add(k, shards[k])
        assert store.find() == held
        every = find_duplicates(names, shards, val={"s1", "s3"}, limit=10_000)
        assert len(every.examples) == every.groups  # the within-split pairs' order too
        assert store.find(limit=10_000) == every
    with DigestStore(names, {"s1", "s3"}, 10, spill_records=1000, bucket_records=300) as store:
        for k in (4, 3, 2, 1, 0):  # more than the count said: spills once past 1,000
            store.add(k, shards[k])
        assert store.bits > 0
        assert store.find() == held


def _paths_by_shard(manifest_path: str) -> dict[str, list[str]]:
    """Each shard's records' ``path`` feature, read back from the shard bytes."""
    manifest = load(manifest_path)
    out = {}
    for shard in manifest.shards:
        data = Path(manifest.shard_url(shard)).read_bytes()
        out[shard.name] = [
            bytes(decode(r.data)["path"][1][0]).decode() for r in tfrecord.scan(data) if r.data
        ]
    return out


@pytest.fixture
def copied_image(tmp_path: Path) -> tuple[Path, list[str]]:
    """40 JPEGs in 4 classes, one of them copied under 8 more names; the set written as 4 shards."""
    raw = tmp_path / "raw"
    write_synthetic(str(raw), 40, 16, classes=4, workers=1)
    original = sorted((raw / "00").iterdir())[0]
    copies = [f"00/copy-{i}.jpg" for i in range(8)]
    for name in copies:
        shutil.copyfile(original, raw / name)
    runner = CliRunner()
    listed = runner.invoke(app, ["list", str(raw), "--out", str(tmp_path / "listing")])
    assert listed.exit_code == 0, listed.output
    wrote = runner.invoke(
        app,
        [
            "write",
            str(tmp_path / "listing"),
            "--out",
            str(tmp_path / "shards"),
            "--manifest",
            str(tmp_path / "manifest.json"),
            "--num-shards",
            "4",
            "--workers",
            "1",
            "--no-progress",
        ],
    )
    assert wrote.exit_code == 0, wrote.output
    return tmp_path, [original.relative_to(raw).as_posix(), *copies]


def _validate(tmp_path: Path, *extra: str) -> tuple[int, str, dict]:  # type: ignore[type-arg]
    metrics = tmp_path / "metrics.json"
    args = [str(tmp_path / "manifest.json"), "--metrics", str(metrics), "--workers", "1"]
    args += ["--val-fraction", "0.5", "--split-seed", "0", "--no-progress", *extra]
    result = CliRunner().invoke(app, ["validate", *args])
    return result.exit_code, result.stderr, json.loads(metrics.read_text())


def test_image_copied_under_other_names_is_reported_across_the_split(copied_image):
    tmp_path, names = copied_image
    manifest_path = str(tmp_path / "manifest.json")
    # Where the nine records landed, from the shards themselves and the training split.
    val = {s.name for s in splits.split(load(manifest_path), 0.5, 0).val}
    sides = {
        shard in val
        for shard, paths in _paths_by_shard(manifest_path).items()
        for path in paths
        if path in names
    }
    assert sides == {True, False}, "the copies should land on both sides for this seed"

    code, stderr, metrics = _validate(tmp_path)
    assert code == 0, stderr
    assert metrics["duplicates"] == {
        "across_splits": 1,
        "groups": 1,
        "label_conflicts": 0,
        "records": 8,
    }
    assert metrics["ok"] is True
    assert (
        "warning: 8 records repeat another's payload (1 payloads, 1 across the split, "
        "0 under two labels)" in stderr
    )
    assert "in training and validation" in stderr


def test_fail_on_leakage_makes_the_cross_split_copy_a_problem_naming_both(copied_image):
    tmp_path, names = copied_image
    code, stderr, metrics = _validate(tmp_path, "--fail-on-leakage", "true")
    assert code == 1
    assert metrics["ok"] is False and metrics["problems"] == 1
    lines = [line for line in stderr.splitlines() if "(fail_on_leakage is true)" in line]
    assert len(lines) == 1, stderr
    assert lines[0].count(".tfrecord") == 2 and "in training and validation" in lines[0]
    assert sum(name in lines[0] for name in names) == 2


def test_fail_on_leakage_accepts_only_true_or_false(copied_image):
    tmp_path, _ = copied_image
    result = CliRunner().invoke(
        app, ["validate", str(tmp_path / "manifest.json"), "--fail-on-leakage", "maybe"]
    )
    assert result.exit_code == 2
    assert "expected true or false, got 'maybe'" in result.output


def test_label_conflicts_are_counted_apart_from_plain_duplicates():
    a, b, c = _digest("a"), _digest("b"), _digest("c")
    labels = [np.array(ids, np.int32).tobytes() for ids in ([0, 1, 2], [1, 2])]
    found = find_duplicates(["s0", "s1"], [a + b + c, a + c], labels=labels)
    assert found.metrics() == {"across_splits": 0, "groups": 2, "label_conflicts": 1, "records": 2}
    first = found.examples[0]
    assert first.conflict == (0, 1) and first.first == ("s0", 0) and first.second == ("s1", 0)
    assert "label conflict: record 0: same payload" in first.what
    assert "labelled both id 0 and id 1" in first.what
    assert found.examples[1].conflict is None  # c: label 2 twice, a plain duplicate


def test_a_label_conflict_names_a_record_of_each_label():
    """Three records of one payload, labelled a, a, b: the pair shown is one a and the b,
    not the first two (both a), whatever the order the shards arrive in."""
    a = _digest("a")
    labels = [np.array(ids, np.int32).tobytes() for ids in ([0, 0], [1])]
    for order in ((0, 1), (1, 0)):
        names, digests = ["s0", "s1"], [a + a, a]
        store_args = ([names[i] for i in order], [digests[i] for i in order])
        found = find_duplicates(*store_args, labels=[labels[i] for i in order])
        (shown,) = found.examples
        assert shown.conflict == (0, 1)
        assert {shown.first, shown.second} == {("s0", 0), ("s1", 0)}, order


@pytest.fixture
def image_under_two_labels(tmp_path: Path) -> tuple[Path, str, str]:
    """40 JPEGs in 4 classes; one of class 00 also copied into class 01."""
    raw = tmp_path / "raw"
    write_synthetic(str(raw), 40, 16, classes=4, workers=1)
    original = sorted((raw / "00").iterdir())[0]
    shutil.copyfile(original, raw / "01" / "also-me.jpg")
    runner = CliRunner()
    listed = runner.invoke(app, ["list", str(raw), "--out", str(tmp_path / "listing")])
    assert listed.exit_code == 0, listed.output
    args = ["write", str(tmp_path / "listing"), "--out", str(tmp_path / "shards")]
    args += ["--manifest", str(tmp_path / "manifest.json"), "--num-shards", "4"]
    wrote = runner.invoke(app, [*args, "--workers", "1", "--no-progress"])
    assert wrote.exit_code == 0, wrote.output
    return tmp_path, original.relative_to(raw).as_posix(), "01/also-me.jpg"


def test_the_same_image_under_two_labels_fails_validate_naming_both(image_under_two_labels):
    tmp_path, first, second = image_under_two_labels
    code, stderr, metrics = _validate(tmp_path)
    assert code == 1
    assert metrics["duplicates"]["label_conflicts"] == 1 and metrics["problems"] == 1
    lines = [line for line in stderr.splitlines() if "label conflict" in line]
    assert len(lines) == 1, stderr
    assert first in lines[0] and second in lines[0]
    assert "labelled both '00' and '01' (fail_on_label_conflict is true)" in lines[0]


def test_label_conflicts_can_be_only_counted(image_under_two_labels):
    tmp_path, _, _ = image_under_two_labels
    code, stderr, metrics = _validate(tmp_path, "--fail-on-label-conflict", "false")
    assert code == 0, stderr
    assert metrics["ok"] is True and metrics["duplicates"]["label_conflicts"] == 1
    assert "1 under two labels" in stderr and "warning: " in stderr and "label conflict" in stderr


@pytest.mark.parametrize("decode_images", [False, True], ids=["bulk", "per-record"])
def test_every_record_path_reads_the_same_digests(copied_image, loop, decode_images):
    tmp_path, _ = copied_image
    config = ValidateConfig(
        str(tmp_path / "manifest.json"),
        executor="serial",
        val_fraction=0.5,
        decode_images=decode_images,
    )
    report = validate(config)
    assert report.ok
    assert report.duplicates.metrics() == {
        "across_splits": 1,
        "groups": 1,
        "label_conflicts": 0,
        "records": 8,
    }
    assert all(all(p) for p in (d.paths for d in report.duplicates.examples))


def test_split_seed_none_splits_with_the_training_seed_as_the_train_stage_does(copied_image):
    tmp_path, _ = copied_image
    manifest = load(str(tmp_path / "manifest.json"))
    seeds = [
        s for s in range(20) if splits.split(manifest, 0.5, s) != splits.split(manifest, 0.5, 0)
    ]
    other = seeds[0]  # a seed whose split differs from seed 0's

    def sides(*args: str) -> dict:  # type: ignore[type-arg]
        code, stderr, metrics = _validate(tmp_path, *args)
        assert code == 0, stderr
        return metrics["split"]

    assert sides("--split-seed", "none", "--seed", str(other)) == sides("--split-seed", str(other))
    assert sides("--split-seed", "none", "--seed", "0") != sides("--split-seed", str(other))
    assert sides("--split-seed", "0", "--seed", str(other)) == sides("--split-seed", "0")
